"""``radix-global simulate [TRACE]``: the paper-scale experiments on a simulated cluster.

Examples::

    radix-global simulate                         # default: committed config, first 3000 requests
    radix-global simulate --limit 0               # the whole trace
    radix-global simulate --experiments scale     # 16..1024 instances: decision time, memory
    radix-global simulate my_trace.jsonl --loads 1,2,3 --instances 16 --experiments fig5
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from radix_global_tools.simulate import experiments, metrics, report
from radix_global_tools.simulate.config import DEFAULT_CONFIG, SimConfigError, load_config
from radix_global_tools.simulate.workload import TraceFormatError, read_trace

EXPERIMENTS = ("fig5", "fig10", "admission", "scale", "oracle")
# ``scale`` runs up to 1,024 instances (tens of minutes on one core): only when asked for.
DEFAULT_EXPERIMENTS = ("fig5", "fig10", "admission")


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from exc
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("loads must be positive")
    return values


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("instance counts must be >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radix-global simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", nargs="?", help="Mooncake-format JSONL trace (default: config's)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="simulator TOML config")
    p.add_argument("--limit", type=int, help="first N requests of the trace (0 = all)")
    p.add_argument("--loads", type=_floats, help="fig5 rate multipliers, e.g. 1,2,3")
    p.add_argument("--instances", type=int, help="fig5 prefill instances")
    p.add_argument("--scale-instances", type=_ints, help="scale experiment sizes, e.g. 16,64")
    p.add_argument("--scale-requests-per-copy", type=int,
                   help="scale experiment: requests replayed per trace copy")
    p.add_argument("--experiments", default=",".join(DEFAULT_EXPERIMENTS),
                   help=f"comma list of {', '.join(EXPERIMENTS)} "
                        f"(default {','.join(DEFAULT_EXPERIMENTS)})")
    p.add_argument("--out", default="benchmarks/results", help="folder for JSON and PNG")
    p.add_argument("--tag", default="simulate", help="file name stem of the outputs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Wide enough for the fig5 table when the output is a file or a pipe, not a terminal.
    console = Console(width=200) if not sys.stdout.isatty() else Console()
    chosen = [e.strip() for e in args.experiments.split(",") if e.strip()]
    unknown = [e for e in chosen if e not in EXPERIMENTS]
    if unknown:
        console.print(f"[red]unknown experiment(s): {', '.join(unknown)}[/red]")
        return 2
    try:
        cfg = load_config(args.config)
    except SimConfigError as exc:
        console.print(f"[red]config: {exc}[/red]")
        return 2
    cfg = replace(
        cfg,
        trace=args.trace or cfg.trace,
        limit=cfg.limit if args.limit is None else args.limit,
        fig5_loads=args.loads or cfg.fig5_loads,
        fig5_instances=args.instances or cfg.fig5_instances,
        scale_instances=args.scale_instances or cfg.scale_instances,
        scale_requests_per_copy=args.scale_requests_per_copy or cfg.scale_requests_per_copy,
    )
    try:
        trace = read_trace(cfg.trace, cfg.limit)
    except (OSError, TraceFormatError) as exc:
        console.print(f"[red]trace: {exc}[/red]")
        return 2
    if not trace:
        console.print("[red]trace is empty[/red]")
        return 2

    def progress(msg: str) -> None:
        console.log(msg)

    started = time.perf_counter()
    out: dict[str, Any] = {
        "command": "radix-global simulate " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {platform.python_version()}",
        "config_file": args.config,
        "trace": cfg.trace,
        "requests": len(trace),
        "calibration": dataclasses.asdict(cfg.calibration),
    }
    tables = []
    results = Path(args.out)
    # Load-independent lower bound of any policy's mean TTFT (metrics.oracle_mean_ttft_s).
    oracle = metrics.oracle_mean_ttft_s(cfg.calibration, trace)
    out["oracle_mean_ttft_s"] = oracle
    if "oracle" in chosen:
        console.print(f"oracle bound of the mean TTFT (no queueing, every earlier page reused): "
                      f"{oracle:.3f} s over {len(trace)} requests")
    if "fig5" in chosen:
        res5 = experiments.fig5(cfg, trace, cfg.fig5_loads, cfg.fig5_instances, progress)
        out["fig5"] = {"instances": cfg.fig5_instances, "paper_mean_ttft_s": cfg.paper_fig5,
                       "by_policy": res5}
        tables.append(report.fig5_table(res5, cfg.paper_fig5, oracle))
        report.plot_fig5(results / f"{args.tag}_fig5_ttft_vs_load.png", res5,
                         f"{cfg.fig5_instances} prefill instances, {len(trace)} requests")
    if "fig10" in chosen:
        res10 = experiments.fig10(cfg, trace, progress)
        out["fig10"] = res10
        tables.append(report.fig10_table(res10, cfg.paper_fig10_hit_ratio,
                                         cfg.paper_fig10_prefill_ratio))
    if "admission" in chosen:
        resa = experiments.admission(cfg, trace, progress)
        out["admission"] = resa
        tables.append(report.admission_table(resa, cfg.calibration.ttft_slo_s))
    if "scale" in chosen:
        rows = experiments.scale(cfg, trace, cfg.scale_instances, progress)
        out["scale"] = rows
        tables.append(report.scale_table(rows))
    out["wall_s"] = time.perf_counter() - started
    report.print_tables(console, *tables)
    path = results / f"{args.tag}.json"
    report.save_json(path, out)
    console.print(f"wrote {path} ({out['wall_s']:.0f} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
