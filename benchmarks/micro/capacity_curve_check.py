"""The planner's reuse curve against the simulator, on a whole trace.

    python -m benchmarks.micro.capacity_curve_check [TRACE] [--instances 10] [--out FILE]

The curve (``radix_global_tools/plan/capacity_curve.py``, one LRU pass) at an unbounded
capacity, against the hit rate of one simulation (``radix-global simulate``'s
``global_cache_aware``: the conductor with a global pool) whose pool holds every page of the
trace; and the curve at the capacities of the paper's Fig. 10 discussion (~50M tokens reach
nearly the whole hit rate). Table on stdout, JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.harness.paths import RESULTS
from radix_global_tools.plan.capacity_curve import capacity_curve
from radix_global_tools.simulate.config import DEFAULT_CONFIG, load_config
from radix_global_tools.simulate.experiments import FIG5_SETUPS, run_one
from radix_global_tools.simulate.workload import read_trace

POINTS = (1e6, 3e6, 1e7, 2e7, 3e7, 5e7, 1e8, float("inf"))


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(DEFAULT_CONFIG)
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro.capacity_curve_check",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", nargs="?", default=cfg.trace)
    p.add_argument("--instances", type=int, default=cfg.fig10_instances)
    p.add_argument("--out", default=str(RESULTS / "capacity_curve_check.json"))
    args = p.parse_args(argv)
    cal = cfg.calibration
    trace = read_trace(args.trace)
    t0 = time.perf_counter()
    curve = capacity_curve(trace, cal.page_tokens)
    curve_s = time.perf_counter() - t0
    every_page = len({k for r in trace for k in r.page_keys}) * cal.page_tokens
    t0 = time.perf_counter()
    simulated = run_one(cal, trace, args.instances, FIG5_SETUPS["global_cache_aware"],
                        cal.local_tokens_per_instance, pool_tokens=every_page)[0].hit_rate
    sim_s = time.perf_counter() - t0
    rows = [{"capacity_tokens": c, "hit_rate": curve.hit_rate(c)} for c in POINTS]
    print("| capacity (tokens) | hit rate (curve) |\n|---|---|")
    for r in rows:
        print(f"| {r['capacity_tokens']:,.0f} | {r['hit_rate']:.4f} |")
    print(f"\nunbounded: curve {curve.max_hit_rate:.4f} ({curve_s:.1f} s), simulated "
          f"{simulated:.4f} ({args.instances} instances, pool of every page, {sim_s:.0f} s): "
          f"difference {abs(curve.max_hit_rate - simulated):.4f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "command": "python -m benchmarks.micro.capacity_curve_check " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "requests": len(trace), "curve": [{**r, "capacity_tokens": str(r["capacity_tokens"])}
                                          for r in rows],
        "curve_unbounded": curve.max_hit_rate, "simulated_unbounded": simulated,
        "curve_s": curve_s, "simulation_s": sim_s}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
