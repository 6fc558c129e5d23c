"""Cold recovery on real SGLang CPU workers: the first turns after a full memory loss, loaded
from the pool's disk tier vs recomputed, next to a warm cluster that never lost its memory.

    python -m benchmarks.scenarios.cold_recovery [--history 2048] [--concurrency 1 8 16]
        [--out FILE]

Cluster (``radix_global_tools/cluster/local.py``): our router (conductor) and two of our engines
(one core each, one shm pool, ``--pool-disk DIR``). Every conversation has one turn of ``--history``
token ids behind it, and its measured turn adds 64 tokens and asks for 8, greedy. For each
concurrency C there are three sets of C conversations of the same shape (other tokens):

1. all sets get their first turn on the first cluster; ``warm``: the first set's next turns,
   C at once, on that cluster;
2. the host "reboots": engines and router stop and the shm pool is destroyed; the cluster
   starts again on the same disk folder (and each engine answers four short requests, its own
   start-up cost). ``disk``: the second set's next turns, C at once;
3. it reboots again without the disk tier. ``recompute``: the third set's next turns.

Reported: TTFT p50 / p90 per (condition, C) and recompute / disk at p50. Table on stdout, JSON
to ``--out``; recorded in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from radix_global.trace import block_prompt
from radix_global_tools.cluster.local import EngineSet, LocalCluster, RouterSpec
from radix_global_tools.replay.client import stream_ids
from radix_global_tools.replay.stats import RequestResult, SloTargets, summarize

CONDITIONS = ("warm", "disk", "recompute")
MESSAGE_TOKENS = 64
OUTPUT_TOKENS = 8


def history(condition: int, c: int, i: int, tokens: int) -> list[int]:
    base = 1_000_000 * (condition + 1) + 10_000 * c + 100 * i
    return block_prompt([base + k for k in range(tokens // 256)], 256)


def message(condition: int, c: int, i: int) -> list[int]:
    return block_prompt([9_000_000 + 1_000 * condition + 100 * c + i], MESSAGE_TOKENS)


async def turns(url: str, prompts: list[list[int]]) -> tuple[list[RequestResult], float]:
    """All at once; the results in order, and the wall time."""
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        done = await asyncio.gather(*(stream_ids(client, url, ids, OUTPUT_TOKENS, i, t0)
                                      for i, ids in enumerate(prompts)))
    return [r for r, _ in done], time.perf_counter() - t0


def start(cluster: LocalCluster, model_dir: str, disk: Path | None) -> tuple[Any, Any]:
    router = cluster.start_router(RouterSpec("ours", "conductor", {}), None, model_dir=model_dir)
    extra = (("--radix-global-pool-disk", str(disk), "--radix-global-pool-disk-gb", "4") if disk
             else ())
    engines = cluster.start_engines(EngineSet("ours", model_dir, n=2, extra_args=extra),
                                    router.url)
    cluster.wait_workers(router, 2)
    # One short request per engine first: an engine's first requests after its start pay for
    # lazy set-up that is no part of what is measured.
    warm = [block_prompt([8_000_000 + i], 64) for i in range(4)]
    for url in engines.urls:
        for ids in warm:
            httpx.post(url + "/generate", json={"input_ids": ids, "sampling_params": {
                "max_new_tokens": 4}}, timeout=300).raise_for_status()
    return router, engines


def reboot(cluster: LocalCluster, router: Any, engines: Any) -> None:
    """Engines, router and the shm pool gone: what a host's reboot leaves is the disk."""
    cluster.stop_engines(engines)
    cluster.stop(router)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.cold_recovery")
    ap.add_argument("--history", type=int, default=2048, help="tokens behind each measured turn")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--model-dir", default=None, help="default: radix-global make-model's")
    ap.add_argument("--out", default="benchmarks/results/cold_recovery.json")
    args = ap.parse_args(argv)
    if args.model_dir is None:
        from sglang_patch.make_model import cached_model

        args.model_dir = str(cached_model())
    run_dir = Path(tempfile.mkdtemp(prefix="rg-cold-"))
    disk = run_dir / "disk"
    sets = {(k, c): [history(k, c, i, args.history) for i in range(c)]
            for k in range(len(CONDITIONS)) for c in args.concurrency}
    nxt = {key: [[*h, *message(key[0], key[1], i)] for i, h in enumerate(hs)]
           for key, hs in sets.items()}
    out: dict[str, dict[int, dict[str, Any]]] = {c: {} for c in CONDITIONS}
    with LocalCluster(run_dir) as cluster:
        router, engines = start(cluster, args.model_dir, disk)
        # Every conversation's first turn, 8 at a time; the warm set last, so that it is what
        # the engines' own memory still holds when its next turns come.
        for key in sorted(sets, key=lambda kc: (-kc[0], kc[1])):
            for i in range(0, len(sets[key]), 8):
                asyncio.run(turns(router.url, sets[key][i : i + 8]))
        time.sleep(3.0)  # the last write-throughs
        for cond, disk_on in zip(CONDITIONS, (True, True, False), strict=True):
            if cond != "warm":
                reboot(cluster, router, engines)
                router, engines = start(cluster, args.model_dir, disk if disk_on else None)
            k = CONDITIONS.index(cond)
            for c in args.concurrency:
                results, wall = asyncio.run(turns(router.url, nxt[(k, c)]))
                out[cond][c] = summarize(results, SloTargets(), wall)
                print(f"{cond} C={c}: {out[cond][c]}", file=sys.stderr)
    report = {"history_tokens": args.history - args.history % 256,
              "message_tokens": MESSAGE_TOKENS,
              "output_tokens": OUTPUT_TOKENS, "engines": 2, "results": out,
              "recompute_over_disk_p50": {
                  c: out["recompute"][c]["ttft_p50_s"] / out["disk"][c]["ttft_p50_s"]
                  for c in args.concurrency if out["disk"][c]["ttft_p50_s"]}}
    print(f"{'condition':10} {'C':>3} {'TTFT p50':>9} {'p90':>8} {'from storage':>13}")
    for cond in CONDITIONS:
        for c in args.concurrency:
            s = out[cond][c]
            print(f"{cond:10} {c:>3} {s['ttft_p50_s']:>8.3f}s {s['ttft_p90_s']:>7.3f}s "
                  f"{s['pool_tokens_loaded']:>13}")
    for c, ratio in report["recompute_over_disk_p50"].items():
        print(f"recompute / disk at p50, C={c}: {ratio:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
