"""A Fig. 10 analogue on real engines: delivered hit rate with the global pool vs local caches,
next to what the simulator predicts for the same set-up.

    python -m benchmarks.scenarios.fig10_cpu [--real benchmarks/results/pressure.json]
        [--calibration radix_global_tools/simulate/cpu_config.toml] [--out FILE]

Real: the cache-pressure benchmark's runs (``benchmarks/scenarios/pressure_bench.py``): ours,
conductor + pool, against ``cache_aware`` over each engine's local HiCache (L1 + L2), both routed
cache-aware; delivered = the engines' own cached-token reports over the prompt tokens
(``docs/interfaces.md``, "The reuse breakdown"). Simulated: the same plans (every load point of both
workloads of ``benchmarks/data/pressure.toml``, request for request: arrival, token-id pages, output
length; an agent turn at its earliest time, as if every answer were instant: the simulator does not
wait for answers) on
the simulator (``radix_global_tools/simulate``) with the CPU calibration of the tiny model, as many
instances as the benchmark has engines: ``global_cache_aware`` (conductor + pool) against
``local_cache_aware`` (the conductor over local caches; the simulator has no sglang-router, whose
approximate tree the conductor's exact one bounds from above). Table on stdout, JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import RESULTS
from benchmarks.scenarios.pressure_bench import CONTENDERS, FULL_TRACE, SAMPLE_TRACE, Point, points
from benchmarks.scenarios.pressure_plan import DEFAULT_CONFIG, load_config
from radix_global.keys import page_keys
from radix_global_tools.simulate.config import CPU_CONFIG, Calibration, load_calibration
from radix_global_tools.simulate.experiments import FIG5_SETUPS, run_one
from radix_global_tools.simulate.workload import SimRequest

LOCAL, GLOBAL = CONTENDERS[0].name, CONTENDERS[2].name
SIMULATED = ("local_cache_aware", "global_cache_aware")


def sim_requests(point: Point, page_size: int) -> list[SimRequest]:
    return [SimRequest(f"r{p.position}", p.send_at_s, len(p.input_ids), p.output_tokens,
                       tuple(page_keys(p.input_ids, page_size))) for p in point.plan]


def simulate(point: Point, cal: Calibration, instances: int) -> dict[str, float]:
    reqs = sim_requests(point, cal.page_tokens)
    return {label: run_one(cal, reqs, instances, FIG5_SETUPS[label],
                           cal.local_tokens_per_instance)[0].hit_rate for label in SIMULATED}


def real_hit_rates(runs: list[dict[str, Any]], point: Point) -> dict[str, float | None]:
    """Both contenders' delivered fraction at ``point``, from the first repeat (``--repeats``:
    the one where a contender run ``--once`` ran too, on the same engines' start)."""
    out: dict[str, float | None] = {}
    for name in (LOCAL, GLOBAL):
        row = next((r for r in runs if r.get("contender") == name and not r.get("skipped")
                    and r.get("workload") == point.workload and r.get("load") == point.load
                    and r.get("repeat", 1) == 1), None)
        out[name] = None if row is None else row["reuse"]["delivered_fraction"]
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(v: float | None, pct: bool = True) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%" if pct else f"{v:.2f}x"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.fig10_cpu",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", default=str(RESULTS / "pressure.json"))
    p.add_argument("--calibration", default=str(CPU_CONFIG))
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--trace", default=str(FULL_TRACE if FULL_TRACE.exists() else SAMPLE_TRACE))
    p.add_argument("--out", default=str(RESULTS / "fig10_cpu.json"))
    args = p.parse_args(argv)
    cfg, cal = load_config(args.config), load_calibration(args.calibration)
    if cal.page_tokens != cfg.page_size:
        p.error(f"calibration pages of {cal.page_tokens} tokens, benchmark pages of "
                f"{cfg.page_size}")
    runs = json.loads(Path(args.real).read_text())["runs"]
    rows: list[dict[str, Any]] = []
    for point in points(cfg, ["conversations", "agents"], args.trace):
        sim, real = simulate(point, cal, cfg.engines), real_hit_rates(runs, point)
        rows.append({"workload": point.workload, "load": point.load, "simulated": sim,
                     "simulated_ratio": ratio(sim["global_cache_aware"],
                                              sim["local_cache_aware"]),
                     "real": real, "real_ratio": ratio(real[GLOBAL], real[LOCAL])})
    print(f"| point | simulated local | simulated global | ratio | real {LOCAL} | real {GLOBAL} "
          "| ratio |\n|---|---|---|---|---|---|---|")
    for r in rows:
        s, q = r["simulated"], r["real"]
        print(f"| {r['workload']} @ {r['load']} | {fmt(s['local_cache_aware'])} | "
              f"{fmt(s['global_cache_aware'])} | {fmt(r['simulated_ratio'], False)} | "
              f"{fmt(q[LOCAL])} | {fmt(q[GLOBAL])} | {fmt(r['real_ratio'], False)} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "calibration":
                                          args.calibration, "real": args.real, "rows": rows},
                                         indent=1))
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
