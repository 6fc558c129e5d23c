"""Fetching a prefix from another host's Mooncake segment vs recomputing it, on real SGLang CPU
workers on test hosts: where fetching pays.

    python -m benchmarks.micro.mooncake_fetch_bench [--lengths 1024 4096] [--repeats 3]
        [--link-mbit 0 100]

Hosts (``radix_global_tools/cluster/hosts.py``): ``a`` and ``b`` run one worker each (``radix-global
sglang
--pool mooncake://M``, one core each), ``m`` the Mooncake master, ``r`` the router the workers
register with (the requests go to the workers directly, from host ``r``). Per link setting (0:
unshaped; else ``tc tbf`` on b's cable) and prompt length L, each repeat takes a fresh prompt P of
L tokens:
1. A computes P (write-through puts its pages into A's segment);
2. B answers P + 16 tokens: it fetches P from A's segment over the link (``fetch``; the engine
   must report at least L - 2 pages from storage, else the run is refused);
3. B answers a fresh prompt of the same length, which it computes whole (``recompute``).
Latency is the whole non-streamed request with one output token: prefill plus one step.
Reported: median (min-max) per kind and fetch/recompute: below 1 fetching pays. Where it crosses
1 as the link slows is the break-even. Table on stdout, JSON to ``--out``; recorded in
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.spread import median_spread, spread_text

PAGE = 16
SUFFIX = 16


def _generate(c: Any, url: str, ids: list[int]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    r = c.request("POST", url + "/generate", timeout=600.0, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed, r.json()


def _storage(answer: dict[str, Any]) -> int:
    return int((answer["meta_info"].get("cached_tokens_details") or {}).get("storage") or 0)


def run(model_dir: str, lengths: list[int], repeats: int, links: list[float]
        ) -> list[dict[str, Any]]:
    from radix_global import kv_size
    from radix_global.trace import synthesize_prompt
    from radix_global_tools.cluster.host_cluster import HostCluster
    from radix_global_tools.cluster.hosts import HostSet

    kv_bytes = kv_size.for_worker(model_dir, {"dtype": "float32"}) or 0
    rows = []
    seeds = itertools.count(700_000, 10)

    def fresh(n: int) -> list[int]:
        """A prompt of ``n`` tokens no engine has seen."""
        first = next(seeds)
        return synthesize_prompt(list(range(first, first + 8)), 8 * 512, n // 8)

    with HostSet(["a", "b", "r", "m"], tempfile.mkdtemp(prefix="rg-fetch-bench-")) as hosts:
        c = HostCluster(hosts, model_dir, client_host="r", page_size=PAGE)
        try:
            master = c.start_mooncake_master("m")
            router = c.start_router("r", options=["--profile-max-tokens", "0"])
            a, b = (c.start_worker(h, router, cores={n}, mooncake=master)
                    for n, h in enumerate("ab"))
            c.wait_http([a, b])
            for mbit in links:
                hosts.shape("b", mbit or None)
                for length in lengths:
                    fetch, recompute = [], []
                    for _ in range(repeats):
                        p = fresh(length)
                        _generate(c, a.url, p)
                        time.sleep(2.0)  # write-through reaches A's segment
                        t_fetch, got = _generate(c, b.url, [*p, *fresh(SUFFIX)])
                        if _storage(got) < length - 2 * PAGE:
                            raise RuntimeError(f"B loaded {_storage(got)} of {length} tokens "
                                               "from storage: not a fetch")
                        t_cold, _ = _generate(c, b.url, fresh(length + SUFFIX))
                        fetch.append(t_fetch)
                        recompute.append(t_cold)
                    row: dict[str, Any] = {"link_mbit": mbit or None, "prompt_tokens": length,
                           "kv_bytes": length * kv_bytes, "fetch_s": median_spread(fetch),
                           "recompute_s": median_spread(recompute)}
                    row["fetch_vs_recompute"] = (row["fetch_s"]["median"]
                                                 / row["recompute_s"]["median"])
                    rows.append(row)
                    print(_line(row), flush=True)
        finally:
            c.close()
    return rows


def _line(row: dict[str, Any]) -> str:
    def s(key: str) -> str:
        return spread_text(row[key], ".3f") + " s"

    link = "unshaped" if row["link_mbit"] is None else f"{row['link_mbit']:.0f} Mbit/s"
    return (f"{link:<12} {row['prompt_tokens']:>5} tokens ({row['kv_bytes'] / 1e6:.1f} MB KV)  "
            f"fetch {s('fetch_s')}  recompute {s('recompute_s')}  "
            f"fetch/recompute {row['fetch_vs_recompute']:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.micro.mooncake_fetch_bench")
    ap.add_argument("--model", default="build/tiny-llama")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--link-mbit", type=float, nargs="+", default=[0.0, 100.0])
    ap.add_argument("--out", default="benchmarks/results/mooncake_fetch_bench.json")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from sglang_patch.make_model import ensure_model

    ensure_model(args.model)
    rows = run(str(Path(args.model).resolve()), args.lengths, args.repeats, args.link_mbit)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
