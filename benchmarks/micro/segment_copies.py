"""Copies against a hot spot, in the simulator's Mooncake layout (issue 43's "more bandwidth
against more copies"; issue 44's copies).

    python -m benchmarks.micro.segment_copies [--rates 4 8] [--bandwidths 5e9 8.7e9]
        [--instances 8] [--requests 600] [--seed 1] [--out FILE]

An agent platform's requests (``agent_requests``: ``prompts`` system prompts of 16 blocks with
Zipf(1.1) popularity, each request one of them plus two blocks of its own, 64 output tokens,
Poisson arrivals) on the A800 profile, co-located instances whose own caches (4,096 tokens)
cannot hold a prompt, so every turn is a pool fetch or a recompute; a pool of 16 prompts' worth.
For each arrival rate and fabric: the striped pool (no sender bottleneck) and the pool as
per-instance segments (``radix_global_tools/simulate/segments.py``: one copy of a page, a
segment's link sending one transfer at a time) with 0, 1 and 2 extra copies of hot prefixes
(the router's copy rounds every 10 s). Prints the share of requests within a 2 s TTFT, the hit
rate, the fetches and their mean time, and the pages of copies held; JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import RESULTS
from radix_global.types import PageKey
from radix_global_tools.plan.search import Targets, outcome, segmented_pool
from radix_global_tools.plan.sizing import Sizing
from radix_global_tools.simulate.config import DEFAULT_CONFIG, load_calibration
from radix_global_tools.simulate.experiments import FIG5_SETUPS, run_one
from radix_global_tools.simulate.workload import SimRequest

PROMPT_PAGES = 16
LOCAL_TOKENS = 4096
TARGETS = Targets(ttft_slo_s=2.0, tbt_slo_s=1.0, accept=0.95)


def agent_requests(n: int, rate: float, prompts: int, seed: int = 1) -> list[SimRequest]:
    """``n`` requests at ``rate`` per second: a Zipf(1.1)-popular system prompt of
    ``PROMPT_PAGES`` blocks (512 tokens each) and two blocks of the request's own."""
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        p = min(int(rng.paretovariate(1.1)) - 1, prompts - 1)
        keys = [PageKey(1000 * p + k) for k in range(PROMPT_PAGES)]
        keys += [PageKey(10**6 + 2 * i), PageKey(10**6 + 2 * i + 1)]
        out.append(SimRequest(f"r{i}", t, len(keys) * 512, 64, tuple(keys)))
    return out


def one(requests: list[SimRequest], instances: int, bw: float, copies: int | None
        ) -> dict[str, Any]:
    cal = replace(load_calibration(DEFAULT_CONFIG), bandwidth_bytes_per_s=bw,
                  local_tokens_per_instance=LOCAL_TOKENS, disk_read_bytes_per_s=None)
    pool = PROMPT_PAGES * 512 * 16
    s = Sizing(instances, 0, pool, bw, 0, LOCAL_TOKENS, copies)
    _, sim = run_one(cal, requests, instances, FIG5_SETUPS["global_cache_aware"], LOCAL_TOKENS,
                     pool_tokens=pool, colocated=True, prefill_batch=2,
                     fault_domains=segmented_pool(s))
    o = outcome(s, sim.records, TARGETS)
    fetched = [r.fetch_s for r in sim.records if r.fetched_tokens]
    return {"copies": copies, "ttft_share": o.ttft_share, "hit_rate": o.hit_rate,
            "p99_ttft_s": o.p99_ttft_s, "fetches": len(fetched),
            "mean_fetch_s": sum(fetched) / len(fetched) if fetched else 0.0,
            "copy_pages": sim.rounds.planner.pages() if sim.rounds is not None else 0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro.segment_copies",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=float, nargs="+", default=[4.0, 8.0])
    p.add_argument("--bandwidths", type=float, nargs="+", default=[5e9, 8.7e9],
                   help="fabric bytes per second per instance")
    p.add_argument("--instances", type=int, default=8)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--seed", type=int, default=1, help="the workload's random seed")
    p.add_argument("--out", default=str(RESULTS / "segment_copies.json"))
    args = p.parse_args(argv)
    rows = []
    print("| req/s | GB/s | pool | TTFT <= 2 s | hit rate | fetches | mean fetch s | copy pages |")
    print("|---|---|---|---|---|---|---|---|")
    for rate in args.rates:
        reqs = agent_requests(args.requests, rate, args.prompts, seed=args.seed)
        for bw in args.bandwidths:
            for copies in (None, 0, 1, 2):
                r = {"rate": rate, "bandwidth_Bps": bw, "seed": args.seed,
                     **one(reqs, args.instances, bw, copies)}
                rows.append(r)
                pool = "striped" if copies is None else f"segments, {copies} copies"
                print(f"| {rate:g} | {bw / 1e9:g} | {pool} | {r['ttft_share']:.3f} | "
                      f"{r['hit_rate']:.3f} | {r['fetches']} | {r['mean_fetch_s']:.3f} | "
                      f"{r['copy_pages']} |", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "command": "python -m benchmarks.micro.segment_copies " + " ".join(
            argv if argv is not None else sys.argv[1:]), "rows": rows}, indent=1))
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
