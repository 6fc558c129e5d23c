"""``radix-global plan TRACE``: the cheapest cluster that meets a TTFT and a TBT SLO for a share
of the requests of a Mooncake-format trace.

Examples::

    radix-global plan ../shared/traces/conversation_trace.jsonl --ttft-slo 30 --tbt-slo 0.1
    radix-global plan my_trace.jsonl --ttft-slo 2 --tbt-slo 0.05 --accept 0.95 \\
        --hardware my_profile.toml --cost my_prices.toml --bandwidths 100,400
    radix-global plan trace.jsonl --ttft-slo 30 --tbt-slo 0.1 --kv-bytes-per-token 163840 \\
        --prefill-speedup 1.5        # what if: a smaller KV per token, a faster prefill kernel

A hardware profile is a simulator file with the ``[model] [prefill] [network] [decode] [cache]
[slo]`` tables (``a800``: the committed FLOP-derived profile, ``paper_config.toml``; ``cpu``: this
project's CPU engines, ``cpu_config.toml``; or a path, e.g. one fitted with
``python -m benchmarks.scenarios.decode_probe --url`` on your own engine). Prints the reuse curve
and the trade-off table, writes ``<tag>.toml`` (the plan), ``<tag>_router.toml`` (the router's
settings for it), ``<tag>.json`` (every simulation) and ``<tag>.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from radix_global_tools.plan import report
from radix_global_tools.plan.capacity_curve import capacity_curve
from radix_global_tools.plan.costs import CostFileError, load_costs
from radix_global_tools.plan.plan_file import write_plan
from radix_global_tools.plan.search import PlanError, Planner, Targets, attainable_share
from radix_global_tools.simulate.config import (
    CPU_CONFIG,
    DEFAULT_CONFIG,
    SimConfigError,
    load_calibration,
)
from radix_global_tools.simulate.workload import TraceFormatError, read_trace, regroup, scale_load

PROFILES = {"a800": DEFAULT_CONFIG, "cpu": CPU_CONFIG}


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return v


def _gbits(text: str) -> tuple[float, ...]:
    return tuple(_positive(x) for x in text.split(",") if x.strip())


def _counts(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not whole numbers: {text!r}") from exc
    if not out or min(out) < 0 or max(out) > 8:
        raise argparse.ArgumentTypeError(f"want counts from 0 to 8, e.g. 0,1,2: {text!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radix-global plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="Mooncake-format JSONL trace")
    p.add_argument("--ttft-slo", type=_positive, required=True, help="TTFT SLO (seconds)")
    p.add_argument("--tbt-slo", type=_positive, required=True,
                   help="SLO on a request's mean time between tokens (seconds)")
    p.add_argument("--accept", type=_positive, default=0.99,
                   help="share of all requests that must meet both (default 0.99)")
    p.add_argument("--hardware", default="a800",
                   help=f"profile: {', '.join(PROFILES)} or a file (default a800)")
    p.add_argument("--cost", help="cost weights (TOML [cost] table; default: built-in)")
    p.add_argument("--mode", choices=("pd", "colocated"), default="pd",
                   help="prefill/decode disaggregated, or both on every instance (default pd)")
    p.add_argument("--limit", type=int, default=1000,
                   help="first N requests of the trace (0 = all; default 1000)")
    p.add_argument("--load", type=_positive, default=1.0, help="arrival-rate multiplier")
    p.add_argument("--bandwidths", type=_gbits,
                   help="fabric Gbit/s per instance to try (default: the profile's and a tenth)")
    p.add_argument("--copies", type=_counts, default=(),
                   help="extra copies of hot prefixes to try, e.g. 0,1,2: the pool as "
                        "per-instance segments with sender congestion and the router's copy "
                        "rounds (default: a striped pool, no sender bottleneck, no copies)")
    p.add_argument("--kv-bytes-per-token", type=int, help="what if: KV bytes per token")
    p.add_argument("--prefill-speedup", type=_positive, help="what if: prefill this much faster")
    p.add_argument("--page-tokens", type=int,
                   help="what if: page size (a multiple of the trace's block, the profile's page)")
    p.add_argument("--out", default="benchmarks/results", help="folder for the outputs")
    p.add_argument("--tag", default="plan", help="file name stem of the outputs")
    return p


def fail(msg: str) -> int:
    print(f"radix-global plan: error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "radix-global plan " + " ".join(argv if argv is not None else sys.argv[1:])
    console = Console(width=160) if not sys.stdout.isatty() else Console()
    if not 0 < args.accept <= 1:
        return fail(f"--accept must be in (0, 1], got {args.accept}")
    try:
        cal = load_calibration(PROFILES.get(args.hardware, args.hardware))
        costs = load_costs(args.cost)
        trace = scale_load(read_trace(args.trace, max(0, args.limit)), args.load)
    except (SimConfigError, CostFileError, TraceFormatError, OSError) as exc:
        return fail(str(exc))
    if not trace:
        return fail(f"{args.trace}: no requests")
    if args.kv_bytes_per_token is not None:
        if args.kv_bytes_per_token < 1:
            return fail("--kv-bytes-per-token must be >= 1")
        cal = dataclasses.replace(cal, kv_bytes_per_token=args.kv_bytes_per_token)
    if args.prefill_speedup is not None:
        cal = dataclasses.replace(cal, prefill_speedup=args.prefill_speedup)
    if args.page_tokens is not None:
        if args.page_tokens < cal.page_tokens or args.page_tokens % cal.page_tokens:
            return fail(f"--page-tokens must be a multiple of the trace's {cal.page_tokens}-token "
                        "block (a hash id covers one block: smaller pages cannot be keyed)")
        trace = regroup(trace, args.page_tokens // cal.page_tokens)
        cal = dataclasses.replace(cal, page_tokens=args.page_tokens)
    targets = Targets(args.ttft_slo, args.tbt_slo, args.accept)
    bound = attainable_share(trace, cal, targets)
    if bound < args.accept:
        return fail(f"no cluster can meet these SLOs for {args.accept:.1%} of requests: even "
                    f"with no queueing and every earlier page reused, {bound:.1%} meet them")
    bws = tuple(g * 1e9 / 8 for g in args.bandwidths) if args.bandwidths else \
        (cal.bandwidth_bytes_per_s / 10, cal.bandwidth_bytes_per_s)
    curve = capacity_curve(trace, cal.page_tokens)
    console.print(report.curve_table(curve, cal.kv_bytes_per_token))
    started = time.perf_counter()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=None)
        planner = Planner(trace, cal, targets, costs, args.mode == "colocated",
                          lambda msg: bar.update(task, description=msg), copies=args.copies)
        try:
            cands = planner.plan(bws, curve)
        except PlanError as exc:
            return fail(str(exc))
    colocated = args.mode == "colocated"
    console.print(report.tradeoff_table(cands, cal.kv_bytes_per_token, colocated))
    out, best = Path(args.out), cands[0]
    source = {"trace": str(args.trace), "requests": len(trace), "load": args.load,
              "hardware": str(args.hardware)}
    paths = write_plan(out, args.tag, command, best, cal, targets, colocated, source)
    report.plot(out / f"{args.tag}.png", curve, cands, cal.kv_bytes_per_token,
                f"{len(trace)} requests, TTFT <= {args.ttft_slo:g} s and TBT <= "
                f"{args.tbt_slo:g} s for {args.accept:.0%}")
    wall = time.perf_counter() - started
    (out / f"{args.tag}.json").write_text(json.dumps({
        "command": command, "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "calibration": dataclasses.asdict(cal), "costs": dataclasses.asdict(costs),
        "attainable_share": bound, "max_hit_rate": curve.max_hit_rate,
        "simulations": planner.simulations, "wall_s": wall,
        "candidates": [{**c.outcome._asdict(), "sizing": c.outcome.sizing._asdict(),
                        "cost": c.cost, "chosen": c.chosen} for c in cands],
    }, indent=1))
    s = best.outcome.sizing
    copies = f" with {s.copies} extra copies of hot prefixes" if s.copies else ""
    console.print(f"plan: {s.prefill} prefill + {s.decode} decode instances, host cache "
                  f"{s.host_tokens:,} tokens each, pool {s.pool_tokens:,} tokens{copies}, "
                  f"disk {s.disk_tokens:,} tokens, "
                  f"{s.bandwidth_Bps * 8 / 1e9:g} Gbit/s; "
                  f"{best.outcome.both_share:.3f} meet both; {best.cost:,.2f} per hour "
                  f"({planner.simulations} simulations, {wall:.0f} s)")
    console.print("wrote " + ", ".join(str(p) for p in [*paths, out / f"{args.tag}.png"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
