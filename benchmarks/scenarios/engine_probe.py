"""One engine of each kind alone: cold prefill time by prompt length and decode time per token.

    python -m benchmarks.scenarios.engine_probe [--kinds stock-hicache stock-file ours]
        [--sizes 256 512 1024 2048] [--repeats 3] [--output-tokens 32] [--burst N] [--out FILE]

The engines are the cache-pressure benchmark's (``benchmarks/data/pressure.toml``,
``pressure_bench.engine_specs``), one at a time on one core, with nothing else sent to them: it
tells whether one kind computes slower than another (it should not: the same SGLang underneath),
and gives the tiny model's prefill curve on this machine, fitted as the simulator models it
(``radix_global_tools/simulate/config.py`` ``Calibration.prefill_s``: fixed + linear x n + quadratic
x n^2 for a cold prompt of n tokens). ``ours`` is registered with our router (conductor), whose
own fitted profile is reported next to it. Every prompt is new (distinct token ids), greedy,
``ignore_eos``. Kinds with an L3 tier (ours: the pool; stock-file: SGLang's ``file`` backend)
then drop their device and host caches (``/flush_cache``) and get the same prompts again: the
TTFT of a prompt loaded from L3, with the tokens the engine reports from storage. Before that,
every kind gets the same prompts again right away: the TTFT of a device cache hit, which tells the
cost of loading from L3 apart from the cost of computing over a cached prefix. Table on stdout,
JSON to ``--out``.

``--burst N`` adds, after those, N new prompts of each size sent at once (then the next size):
the engine's throughput when it has a queue, which the one-at-a-time requests never show. The
L3 kinds write every computed page through to their tier behind the requests; a burst is where
that work competes with prefill on the engine's one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness.paths import REPO
from benchmarks.scenarios.pressure_bench import engine_specs
from benchmarks.scenarios.pressure_plan import DEFAULT_CONFIG, load_config
from radix_global.trace import DEFAULT_VOCAB
from radix_global_tools.cluster.local import LocalCluster, RouterSpec, flush_caches
from radix_global_tools.replay.client import stream_ids
from radix_global_tools.replay.stats import RequestResult

KINDS = ("stock-hicache", "stock-file", "ours")
VOCAB = (DEFAULT_VOCAB.first_id, DEFAULT_VOCAB.first_id + DEFAULT_VOCAB.size)  # word tokens
L3_SETTLE_S = 3.0  # write-through to L3 runs behind the requests: let the last backups land


def prompts(sizes: list[int], repeats: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(*VOCAB) for _ in range(n)] for n in sizes for _ in range(repeats)]


async def measure(url: str, ids_list: list[list[int]], output_tokens: int
                  ) -> list[dict[str, Any]]:
    rows = []
    async with httpx.AsyncClient(timeout=600) as client:
        for ids in ids_list:
            result, _ = await stream_ids(client, url, ids, output_tokens, 0, time.perf_counter())
            if result.status != "ok" or result.ttft_s is None or result.latency_s is None:
                raise RuntimeError(f"probe request failed: {result.error}")
            decode = (result.latency_s - result.ttft_s) / max(1, output_tokens - 1)
            rows.append({"tokens": len(ids), "ttft_s": result.ttft_s, "decode_s": decode,
                         "cached": result.cached_tokens, "storage": result.pool_tokens_loaded})
    return rows


async def send_at_once(url: str, ids_list: list[list[int]], output_tokens: int, what: str
                       ) -> list[RequestResult]:
    """Every prompt sent at once; their results (one that failed raises, naming ``what``)."""
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(stream_ids(client, url, ids, output_tokens, i, t0)
                                      for i, ids in enumerate(ids_list)))
    for result, _ in done:
        if result.status != "ok" or result.ttft_s is None or result.latency_s is None:
            raise RuntimeError(f"{what} request failed: {result.error}")
    return [result for result, _ in done]


async def measure_burst(url: str, ids_list: list[list[int]], output_tokens: int
                        ) -> dict[str, Any]:
    """Every prompt sent at once: mean TTFT and the time until the last first token."""
    ttfts = [r.sent_s + (r.ttft_s or 0.0)
             for r in await send_at_once(url, ids_list, output_tokens, "burst")]
    return {"tokens": len(ids_list[0]), "requests": len(ids_list),
            "ttft_mean_s": statistics.fmean(ttfts), "last_first_token_s": max(ttfts)}


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Least squares of TTFT = fixed + linear n + quadratic n^2 over the median cold TTFT of
    each prompt length (a median: one slow first request must not bend the curve)."""
    sizes = sorted({r["tokens"] for r in rows})
    n = np.array(sizes, dtype=float)
    t = np.array([statistics.median(r["ttft_s"] for r in rows if r["tokens"] == k)
                  for k in sizes])
    coef, *_ = np.linalg.lstsq(np.stack([np.ones_like(n), n, n * n], axis=1), t, rcond=None)
    return {"fixed_s": float(coef[0]), "linear_s_per_token": float(coef[1]),
            "quadratic_s_per_token2": float(coef[2])}


def probe_kind(cluster: LocalCluster, kind: str, spec: Any, ids_list: list[list[int]],
               output_tokens: int, model_dir: str, bursts: list[list[list[int]]]
               ) -> dict[str, Any]:
    spec = replace(spec, n=1)
    router = None
    if spec.kind == "ours":
        router = cluster.start_router(RouterSpec("ours", "conductor"), None, model_dir=model_dir)
    engines = cluster.start_engines(spec, router.url if router else None, tag=f"{kind}-")
    try:
        url = engines.urls[0]
        warm = [[7 + i] * 64 for i in range(2)]  # first-request costs (graphs, pool creation)
        asyncio.run(measure(url, warm, 4))
        rows = asyncio.run(measure(url, ids_list, output_tokens))
        out: dict[str, Any] = {"kind": kind, "requests": rows, "fit": fit(rows)}
        out["cached"] = asyncio.run(measure(url, ids_list, output_tokens))  # device cache hits
        if spec.kind == "ours" or spec.storage_dir is not None:  # an L3 tier: load from it
            time.sleep(L3_SETTLE_S)
            if flush_caches([url]):
                raise RuntimeError(f"{kind}: /flush_cache refused")
            out["from_l3"] = asyncio.run(measure(url, ids_list, output_tokens))
        out["bursts"] = [asyncio.run(measure_burst(url, b, output_tokens)) for b in bursts]
        if router is not None:
            cluster.wait_workers(router, 1)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                profiles = httpx.get(f"{router.url}/admin/stats", timeout=10).json()["profiles"]
                if profiles and all(p.get("state") != "running" for p in profiles.values()):
                    out["router_profile"] = profiles
                    break
                time.sleep(1)
        return out
    finally:
        cluster.stop_engines(engines)
        if router is not None:
            cluster.stop(router)


def _cells(rows: list[dict[str, Any]], sizes: list[int], key: str = "storage",
           label: str = "from L3") -> list[str]:
    """Median TTFT (min-max) per size; with the median ``key`` tokens where there are any."""
    cells = []
    for n in sizes:
        mine = [r for r in rows if r["tokens"] == n]
        t = [r["ttft_s"] for r in mine]
        cell = f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})"
        reused = statistics.median(r[key] or 0 for r in mine)
        cells.append(cell + (f" [{reused:.0f} {label}]" if reused else ""))
    return cells


def table(results: list[dict[str, Any]], sizes: list[int]) -> str:
    head = ("| kind | prompts | " + " | ".join(f"TTFT {n} tokens (s)" for n in sizes)
            + " | decode ms/token | fit fixed / linear / quadratic |")
    lines = [head, "|" + "---|" * (len(sizes) + 4)]
    for res in results:
        dec = statistics.median(r["decode_s"] for r in res["requests"]) * 1000
        f = res["fit"]
        lines.append(f"| {res['kind']} | cold | " + " | ".join(_cells(res["requests"], sizes))
                     + f" | {dec:.1f} | {f['fixed_s']:.3f} / {f['linear_s_per_token']:.2e} / "
                     f"{f['quadratic_s_per_token2']:.2e} |")
        if "cached" in res:  # results before session 17 have none
            lines.append(f"| {res['kind']} | again, cached | "
                         + " | ".join(_cells(res["cached"], sizes, "cached", "cached"))
                         + " | | |")
        if "from_l3" in res:
            lines.append(f"| {res['kind']} | from L3 | "
                         + " | ".join(_cells(res["from_l3"], sizes)) + " | | |")
    bursts = [(res["kind"], b) for res in results for b in res.get("bursts", [])]
    if bursts:
        lines += ["", "| kind | burst | TTFT mean (s) | last first token (s) |",
                  "|---|---|---|---|"]
        lines += [f"| {kind} | {b['requests']} x {b['tokens']} tokens | {b['ttft_mean_s']:.2f} | "
                  f"{b['last_first_token_s']:.2f} |" for kind, b in bursts]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.engine_probe",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--sizes", nargs="+", type=int, default=[256, 512, 1024, 2048])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--burst", type=int, default=0,
                   help="also send N new prompts of each size at once (default 0: none)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--model-dir", default=str(REPO / "build" / "tiny-llama"))
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "engine_probe.json"))
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    if max(args.sizes) + args.output_tokens > cfg.device_tokens or min(args.sizes) < 16:
        p.error(f"sizes must lie in [16, {cfg.device_tokens - args.output_tokens}]")
    if args.repeats < 1 or args.output_tokens < 2 or args.burst < 0:
        p.error("--repeats >= 1, --output-tokens >= 2 and --burst >= 0")
    ids_list = prompts(args.sizes, args.repeats, seed=15)
    fresh = prompts(args.sizes, args.burst, seed=16)  # never seen by the sequential requests
    bursts = [fresh[i * args.burst:(i + 1) * args.burst] for i in range(len(args.sizes))
              ] if args.burst else []
    results = []
    run_dir = REPO / "build" / f"engine-probe-{time.strftime('%Y%m%d-%H%M%S')}"
    with (tempfile.TemporaryDirectory(prefix="radix-global-file-l3-", dir="/dev/shm") as d,
          LocalCluster(run_dir) as cluster):
        specs = engine_specs(cfg, args.model_dir, d)
        for kind in args.kinds:
            print(f"== {kind}", flush=True)
            results.append(probe_kind(cluster, kind, specs[kind], ids_list, args.output_tokens,
                                      args.model_dir, bursts))
    print(table(results, args.sizes))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "sizes": args.sizes,
                                          "burst": args.burst, "results": results}, indent=1))
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
