"""Does the capacity plan hold on real engines? (issue 43)

    python -m benchmarks.scenarios.plan_check [--duration 240] [--ttft-slo 2] [--tbt-slo 0.5]
        [--accept 0.95] [--sim-only] [--out FILE]

The workload is the cache-pressure benchmark's conversations (``benchmarks/data/pressure.toml``,
``pressure_bench.conversation_point``: 24 interleaved conversations of the Mooncake trace, token
ids of the tiny model) sent over ``--duration`` seconds. The planner (``radix-global plan``'s
search, ``radix_global_tools/plan/search.py``) sizes a co-located cluster for it with this
machine's CPU profile (``radix_global_tools/simulate/cpu_config.toml``) for the SLOs given; then
the same requests are replayed through our router (``conductor``) on real SGLang CPU engines,
at the planned engine count and at one engine fewer, engines of the plan's kind (its pool: our
engines with the pool; none: stock engines with their local HiCache). A request meets its SLOs
when its TTFT and its mean time between tokens ((latency - TTFT) / (output tokens - 1)) are both
within them. ``--dispatch-off``: the router without its dispatch gate (the simulator's router
has none). Table on stdout, JSON (every request) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import FULL_TRACE, REPO, RESULTS
from benchmarks.scenarios.bench import BenchConfig, Contender, Runner
from benchmarks.scenarios.fig10_cpu import sim_requests
from benchmarks.scenarios.pressure_bench import conversation_point, engine_specs
from benchmarks.scenarios.pressure_plan import DEFAULT_CONFIG, load_config
from radix_global_tools.cluster.local import LocalCluster, RouterSpec
from radix_global_tools.plan.capacity_curve import capacity_curve
from radix_global_tools.plan.costs import CostWeights
from radix_global_tools.plan.search import Planner, Targets
from radix_global_tools.plan.sizing import Sizing
from radix_global_tools.replay.client import kv_bytes_per_token
from radix_global_tools.simulate.config import CPU_CONFIG, load_calibration


def share_meeting(requests: list[dict[str, Any]], targets: Targets) -> dict[str, float]:
    """Shares of all requests meeting TTFT, TBT and both (a failed request meets neither)."""
    ttft_ok, tbt_ok = [], []
    for r in requests:
        ok = r["status"] == "ok" and r["ttft_s"] is not None and r["latency_s"] is not None
        steps = max(0, r["output_tokens"] - 1)
        tbt = (r["latency_s"] - r["ttft_s"]) / steps if ok and steps else 0.0
        ttft_ok.append(ok and r["ttft_s"] <= targets.ttft_slo_s)
        tbt_ok.append(ok and tbt <= targets.tbt_slo_s)
    n = len(requests) or 1
    return {"ttft_share": sum(ttft_ok) / n, "tbt_share": sum(tbt_ok) / n,
            "both_share": sum(a and b for a, b in zip(ttft_ok, tbt_ok, strict=True)) / n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.plan_check",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=240.0)
    p.add_argument("--ttft-slo", type=float, default=2.0)
    p.add_argument("--tbt-slo", type=float, default=0.5)
    p.add_argument("--accept", type=float, default=0.95)
    p.add_argument("--sim-only", action="store_true", help="plan, and do not run engines")
    p.add_argument("--dispatch-off", action="store_true",
                   help="the router without its dispatch gate, as the simulator runs it")
    p.add_argument("--out", default=str(RESULTS / "plan_check.json"))
    args = p.parse_args(argv)
    cfg, cal = load_config(DEFAULT_CONFIG), load_calibration(CPU_CONFIG)
    targets = Targets(args.ttft_slo, args.tbt_slo, args.accept)
    point = conversation_point(cfg.conversations, str(FULL_TRACE), cfg.page_size, args.duration)
    reqs = sim_requests(point, cal.page_tokens)
    planner = Planner(reqs, cal, targets, CostWeights(), colocated=True)
    best = planner.plan([cal.bandwidth_bytes_per_s], capacity_curve(reqs, cal.page_tokens))[0]
    # The engines' own caches are pressure.toml's (the profile's), whatever host cache the plan
    # would buy: the check is of the instance count, predicted at the caches the engines have.
    plan = best.outcome.sizing._replace(host_tokens=cal.local_tokens_per_instance)
    counts = [plan.prefill, plan.prefill - 1] if plan.prefill > 1 else [plan.prefill]
    predicted = {n: planner.evaluate(plan._replace(prefill=n))._asdict() for n in counts}
    for v in predicted.values():
        v["sizing"] = v["sizing"]._asdict()
    print(f"{len(reqs)} requests over {args.duration:g} s; plan: {plan.prefill} engines, pool "
          f"{plan.pool_tokens:,} tokens; predicted share meeting both: "
          + ", ".join(f"{n} engines {predicted[n]['both_share']:.3f}" for n in counts),
          flush=True)
    out: dict[str, Any] = {
        "command": "python -m benchmarks.scenarios.plan_check " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "targets": targets._asdict(), "requests": len(reqs), "duration_s": args.duration,
        "plan": plan._asdict(), "predicted": predicted, "real": {}}
    if not args.sim_only:
        out["real"] = run_real(cfg, plan, counts, point, targets, args.dispatch_off)
        print("| engines | predicted both | real TTFT | real TBT | real both |\n"
              "|---|---|---|---|---|")
        for n in counts:
            r = out["real"][n]
            print(f"| {n} | {predicted[n]['both_share']:.3f} | {r['ttft_share']:.3f} | "
                  f"{r['tbt_share']:.3f} | {r['both_share']:.3f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"JSON: {args.out}")
    return 0


def run_real(cfg: Any, plan: Sizing, counts: list[int], point: Any, targets: Targets,
             dispatch_off: bool) -> dict[int, dict[str, Any]]:
    model_dir = str(REPO / "build" / "tiny-llama")
    kind = "ours" if plan.pool_tokens else "stock-hicache"
    run_dir = REPO / "build" / f"plan-check-{time.strftime('%Y%m%d-%H%M%S')}"
    real: dict[int, dict[str, Any]] = {}
    with (tempfile.TemporaryDirectory(prefix="radix-global-plan-", dir="/dev/shm") as d,
          LocalCluster(run_dir) as cluster):
        base = engine_specs(cfg, model_dir, d)[kind]
        specs = {f"{n}": replace(base, n=n) for n in counts}
        bench = BenchConfig(trace="", model_dir=model_dir, engines=max(counts),
                            page_size=cfg.page_size, ttft_slo_s=targets.ttft_slo_s,
                            tbt_slo_s=targets.tbt_slo_s)
        runner = Runner(cluster, bench, specs)
        for n in counts:
            router = RouterSpec("ours", "conductor", {"--dispatch": "off"} if dispatch_off else {})
            c = Contender(f"conductor, {n} engines", f"{n}", router)
            print(f"== {c.name} ({kind})", flush=True)
            row = runner.run(c, point.plan, kv_bytes_per_token(model_dir),
                             duration_s=point.span_s)
            real[n] = {**share_meeting(row["requests_detail"], targets),
                       "requests_detail": row["requests_detail"]}
            print(f"  share meeting both: {real[n]['both_share']:.3f}", flush=True)
    return real


if __name__ == "__main__":
    sys.exit(main())
