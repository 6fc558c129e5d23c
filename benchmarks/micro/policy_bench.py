"""Micro-benchmark: cost of one routing decision (choose + bookkeeping) per policy, pure core:
the mean over each run (median and range of the runs) and the p50 / p99 of every request.

A GlobalIndex holds ``--prompts`` prompts of 24 pages (first 16 on one worker's GPU, all 24 in the
pool); requests cycle through them; each request's prefill completes ``--in-flight`` (8) requests
later, so queues stay short and the regression keeps learning. ``conductor_all`` is the Conductor
pricing every slot (``price_top_k=None``), side by side with the default shortlist.
``--slots`` passes the slots as a list (every decision walks them, the reference) or as the
router's slot table (``router/routing/slot_table.py``, built once: a decision reads it). Prints a
table and writes JSON.

    python -m benchmarks.micro.policy_bench [--requests 2000] [--out benchmarks/results/...]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from radix_global.index import GlobalIndex
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId
from router.routing.contract import RouteRequest, WorkerState
from router.routing.cost import CostModel
from router.routing.driver import PolicyDriver
from router.routing.policies import get_policy
from router.routing.prefill_model import PrefillModel
from router.routing.slot_table import SlotTable

NS = Namespace("bench@1")
POLICIES = ("round_robin", "least_load", "approx_cache", "conductor_all", "conductor")
PAGE = 512


def one_run(policy: str, workers: int, requests: int, prompts: int, seed: int,
            slots: str = "table", in_flight: int = 8) -> list[float]:
    """Microseconds of each request's ``route`` + ``prefill_done`` + ``finished``."""
    rng = random.Random(seed)
    index = GlobalIndex()
    index.register_namespace(NS, PAGE)
    keysets = [[PageKey(rng.getrandbits(62)) for _ in range(24)] for _ in range(prompts)]
    for j, keys in enumerate(keysets):
        index.apply(StorePages(NS, Location(WorkerId(f"w{j % workers}"), 0, Tier.GPU), None,
                               keys[:16]))
        index.apply(StorePages(NS, Location(PoolId("pool"), 0, Tier.POOL), None, keys))
    cost = CostModel(prefill_prior=PrefillModel.llama3_70b_8xa800)
    options = {"price_top_k": None} if policy == "conductor_all" else {}
    driver = PolicyDriver(get_policy(policy.removesuffix("_all"), **options), cost, index)
    ws: Sequence[WorkerState] = [WorkerState(WorkerId(f"w{i}"), NS, pool_id=PoolId("pool"))
                                 for i in range(workers)]
    if slots == "table":
        ws = SlotTable(ws)
    times = []
    clock = time.perf_counter
    for r in range(requests):
        now = r * 0.01
        start = clock()
        driver.route(RouteRequest(f"r{r}", NS, 24 * PAGE, keysets[r % prompts], PAGE), ws, now)
        if r >= in_flight:  # a slot with a request in flight is busy: priced one by one
            driver.prefill_done(f"r{r - in_flight}", now, 0.5)
            driver.finished(f"r{r - in_flight}", True, now)
        times.append(1e6 * (clock() - start))
    return times


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 16, 64],
                    help="slots (one per worker); issue 39 asks for 1,024 and 10,000")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--slots", nargs="+", default=["list", "table"], choices=["list", "table"],
                    help="how the slots are passed: a list walked per decision, or the table")
    ap.add_argument("--in-flight", type=int, default=8,
                    help="requests in flight at once (each ends this many requests later)")
    ap.add_argument("--out", default="benchmarks/results/policy_bench.json")
    args = ap.parse_args()
    rows = []
    print(f"{'policy':14s} {'slots':>5s} {'workers':>7s} {'mean us/req':>12s} {'min':>8s} "
          f"{'max':>8s} {'p50':>8s} {'p99':>8s}")
    for workers in args.workers:
        for policy in args.policies:
            for slots in args.slots:
                runs = [one_run(policy, workers, args.requests, args.prompts, seed, slots,
                                args.in_flight)
                        for seed in range(args.repeats)]
                means = [statistics.mean(r) for r in runs]
                every = [t for r in runs for t in r]
                row = {"policy": policy, "slots": slots, "workers": workers,
                       "median_us": statistics.median(means), "min_us": min(means),
                       "max_us": max(means), "p50_us": _p(every, 0.5),
                       "p99_us": _p(every, 0.99), "requests": args.requests,
                       "in_flight": args.in_flight}
                rows.append(row)
                print(f"{policy:14s} {slots:>5s} {workers:7d} {row['median_us']:12.1f} "
                      f"{row['min_us']:8.1f} {row['max_us']:8.1f} {row['p50_us']:8.1f} "
                      f"{row['p99_us']:8.1f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "policy_bench", "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
