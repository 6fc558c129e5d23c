"""The global cache under cache pressure, on real SGLang CPU engines (issue 15).

    python -m benchmarks.scenarios.pressure_bench [--config benchmarks/data/pressure.toml]
        [--workloads conversations agents] [--contenders NAME ...] [--out FILE]
        [--repeats N [--once NAME ...]] [--reverse] [--quick]

The scenario (``benchmarks/data/pressure.toml``, committed before the first result): engines
whose local caches (device KV pool + HiCache host tier) hold a fraction of the reusable working
set, which fits in the L3 tier; two workloads (``benchmarks/scenarios/pressure_plan.py``), each over
a load sweep. Contenders, on the same machine and engine binary, caches flushed and L3 emptied
between runs:

1. ``sglang-router cache_aware`` + stock SGLang with its local HiCache (L1 + L2);
2. the same + an L3 tier stock SGLang already has: its ``file`` storage backend on one folder
   both engines share (in ``/dev/shm``, as fast as our pool's medium), routing unaware of it;
3. ours: ``conductor`` + our pool (``radix-global sglang --radix-global``);
4. (``--contenders``) ours ``conductor`` in front of contender 1's engines (pool off),
5. ours ``least_load`` + our pool, and the A/B halves of ours: the load probe off, the drag
   off.

Per run: TTFT mean/p50/p90/p99, TBT p90, SLO attainment, bytes moved and the reuse breakdown
(``docs/interfaces.md``, "The reuse breakdown": available / captured / delivered by tier / late).
Runs are grouped by engine set (one start-up each). Table on stdout; JSON (every request) to
``--out``, a TTFT CDF and a reuse bar chart per workload next to it.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import FULL_TRACE, REPO, RESULTS
from benchmarks.harness.reuse import available_tokens, summarize_reuse
from benchmarks.scenarios import bench_report
from benchmarks.scenarios.bench import SAMPLE_TRACE, BenchConfig, Contender, Runner, machine
from benchmarks.scenarios.pressure_plan import (
    DEFAULT_CONFIG,
    Conversations,
    PressureConfig,
    agent_plan,
    conversation_plan,
    load_config,
    working_set_tokens,
)
from benchmarks.scenarios.pressure_report import demo_sentence, reuse_chart, spread, table, verdicts
from radix_global_tools.cluster.local import ClusterError, EngineSet, LocalCluster, RouterSpec
from radix_global_tools.replay.client import kv_bytes_per_token
from radix_global_tools.replay.plan import PlannedRequest
from radix_global_tools.replay.stats import RequestResult
from sglang_patch.make_model import ensure_model

CACHE_AWARE = RouterSpec("sglang-router", "cache_aware")
CONTENDERS = (
    Contender("cache_aware + HiCache L1/L2 (stock)", "stock-hicache", CACHE_AWARE, headline=True),
    Contender("cache_aware + HiCache + shared file L3 (stock)", "stock-file", CACHE_AWARE),
    Contender("conductor + pool (ours)", "ours", RouterSpec("ours", "conductor"), headline=True),
    Contender("conductor, pool off (ours)", "stock-hicache", RouterSpec("ours", "conductor")),
    Contender("least_load + pool (ours)", "ours", RouterSpec("ours", "least_load")),
    # The A/B of the start-up load probe (docs/interfaces.md, "Worker registration"
    # ``pool_load_Bps``): without it the router prices a pool fetch at its 10 GB/s default, nearly
    # free on this machine.
    Contender("conductor + pool, load probe off (ours)", "ours-unprobed",
              RouterSpec("ours", "conductor")),
    # The A/B of the learned drag of a slot's requests (router/routing/drag_model.py): without
    # it the router prices a busy engine's first token as if the engine decoded nothing.
    Contender("conductor + pool, drag off (ours)", "ours",
              RouterSpec("ours", "conductor", {"--drag-half-life": "0"})),
    # The A/B of router-side dispatch (docs/interfaces.md,
    # "Router-side dispatch: holding requests while the engines are busy"): without it every request
    # goes to an engine at once, and a busy engine batches short prompts with long ones.
    Contender("conductor + pool, dispatch off (ours)", "ours",
              RouterSpec("ours", "conductor", {"--dispatch": "off"})),
    # Today's SGLang gateway, smg 1.13 (issue 42), in front of the strongest stock engine set (the
    # shared file L3), in each mode its users pick, with the model's tokenizer (``router_argv``);
    # its defaults (cache threshold 0.3, balance thresholds, KV-pressure weight 0.15 s) as
    # shipped. The hash index needs the positions where engines keep prefix state: the
    # workloads' system prompts and powers of two, and token ids: it keys tokenized requests
    # only (text ones it balances by load: benchmarks/scenarios/peer_check.py).
    Contender("smg cache_aware tree + HiCache + shared file L3", "stock-file",
              RouterSpec("smg", "cache_aware", {"--cache-index": "tree"})),
    Contender("smg cache_aware hash + HiCache + shared file L3", "stock-file",
              RouterSpec("smg", "cache_aware", {"--cache-index": "hash", "--cache-boundaries":
                                                "256,512,1024,1536,2048,3072"}),
              token_ids=True),
    Contender("smg prefix_hash + HiCache + shared file L3", "stock-file",
              RouterSpec("smg", "prefix_hash")),
    Contender("smg least_load (KV pressure) + HiCache + shared file L3", "stock-file",
              RouterSpec("smg", "least_load", {"--least-load-kv-pressure-weight": "0.15"})),
    # smg's event-driven KV index: cache_aware over what the engines report they hold (their KV
    # events, streamed over smg's gRPC protocol: the same engines served by ``--smg-grpc-mode``)
    # instead of what smg itself sent where; its default positional index. Its block size it
    # learns from the events (the engines' page size).
    Contender("smg cache_aware event index + HiCache + shared file L3 (gRPC)", "stock-file-grpc",
              RouterSpec("smg", "cache_aware", {"--kv-index": "positional"})),
)
DEFAULT_CONTENDERS = tuple(c.name for c in CONTENDERS[:3])
# ``--quick`` (make demo): ours against the strongest of today's peer modes (docs/benchmarks.md,
# "Today's peers": smg 1.13's prefix_hash over the shared file L3, ahead of its other modes,
# the event-driven index included, in each of three repeats on 2026-12-07).
DEMO_PAIR = ("smg prefix_hash + HiCache + shared file L3", CONTENDERS[2].name)
ENGINE_ORDER = ("stock-hicache", "stock-file", "stock-file-grpc", "ours", "ours-unprobed")


def engine_specs(cfg: PressureConfig, model_dir: str, storage_dir: str) -> dict[str, EngineSet]:
    hicache = ("--enable-hierarchical-cache", "--hicache-ratio", str(cfg.hicache_ratio),
               "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first",
               "--hicache-write-policy", "write_through")
    local = EngineSet("stock", model_dir, n=cfg.engines, page_size=cfg.page_size,
                      max_total_tokens=cfg.device_tokens, extra_args=hicache)
    file_l3 = ("--hicache-storage-backend", "file",
               "--hicache-storage-prefetch-policy", "wait_complete")
    ours = replace(local, kind="ours", extra_args=("--radix-global-pool-load-probe-tokens", "512"),
                   pool_capacity_gb=cfg.pool_capacity_gb, hicache_ratio=cfg.hicache_ratio)
    shared_file = replace(local, extra_args=(*hicache, *file_l3), storage_dir=storage_dir)
    return {
        "stock-hicache": local,
        "stock-file": shared_file,
        "stock-file-grpc": replace(shared_file, grpc=True),
        "ours": ours,
        "ours-unprobed": replace(ours, extra_args=()),
    }


class Point:
    """One load point of one workload: its plan and how it is described."""

    def __init__(self, workload: str, load: str, plan: list[PlannedRequest], span_s: float,
                 page_size: int) -> None:
        self.workload, self.load, self.plan, self.span_s = workload, load, plan, span_s
        prompts = [p.input_ids for p in plan]
        self.working_set = working_set_tokens(prompts, page_size)
        self.prompt_tokens = sum(len(ids) for ids in prompts)

    def describe(self, local_tokens: int) -> dict[str, Any]:
        return {"workload": self.workload, "load": self.load, "requests": len(self.plan),
                "span_s": self.span_s, "prompt_tokens": self.prompt_tokens,
                "working_set_tokens": self.working_set,
                "working_set_over_local": self.working_set / local_tokens}


def conversation_point(conv: Conversations, trace: str, page_size: int,
                       duration_s: float) -> Point:
    plan, _ = conversation_plan(conv, trace, page_size, duration_s)
    return Point("conversations", f"{len(plan)} req / {duration_s:.0f} s", plan, duration_s,
                 page_size)


def points(cfg: PressureConfig, workloads: list[str], trace: str) -> list[Point]:
    out = []
    if "conversations" in workloads:
        out += [conversation_point(cfg.conversations, trace, cfg.page_size, d)
                for d in cfg.conversations.durations_s]
    if "agents" in workloads:
        for rate in cfg.agents.rates:
            plan = agent_plan(cfg.agents, rate)
            out.append(Point("agents", f"{rate:g} sessions/s", plan, plan[-1].send_at_s,
                             cfg.page_size))
    return out


def demo_point(cfg: PressureConfig, trace: str) -> Point:
    conv = replace(cfg.conversations, conversations=cfg.demo.conversations)
    return conversation_point(conv, trace, cfg.page_size, cfg.demo.duration_s)


def breakdown(point: Point, row: dict[str, Any], page_size: int) -> dict[str, Any]:
    results = [RequestResult(**r) for r in row["requests_detail"]]
    available = available_tokens([p.input_ids for p in point.plan], results, page_size)
    return summarize_reuse(results, available)


def run(cfg: PressureConfig, contenders: list[Contender], pts: list[Point], model_dir: str,
        run_dir: Path, reverse: bool = False) -> list[dict[str, Any]]:
    """Every contender at every point, grouped by engine set (stock first; ``reverse``: ours
    first, so that repeats can rotate which contender meets a fresh machine)."""
    kv_bytes = kv_bytes_per_token(model_dir)
    bench_cfg = BenchConfig(trace="", model_dir=model_dir, engines=cfg.engines,
                            page_size=cfg.page_size, ttft_slo_s=cfg.ttft_slo_s,
                            tbt_slo_s=cfg.tbt_slo_s)
    rows: list[dict[str, Any]] = []
    with (tempfile.TemporaryDirectory(prefix="radix-global-file-l3-", dir="/dev/shm")
          as storage_dir, LocalCluster(run_dir) as cluster):
        runner = Runner(cluster, bench_cfg, engine_specs(cfg, model_dir, storage_dir))
        for c in sorted(contenders, key=lambda c: (ENGINE_ORDER.index(c.engines), c.name),
                        reverse=reverse):
            for pt in pts:
                print(f"== {c.name} | {pt.workload} {pt.load}", flush=True)
                base = {"contender": c.name, "workload": pt.workload, "load": pt.load}
                try:
                    row = runner.run(c, pt.plan, kv_bytes, duration_s=pt.span_s)
                except ClusterError as exc:
                    print(f"  failed: {str(exc)[:2000]}", file=sys.stderr)
                    rows.append({**base, "skipped": f"cluster error: {str(exc)[:200]}"})
                    continue
                row = {**row, **base, "reuse": breakdown(pt, row, cfg.page_size)}
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pressure_bench", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--trace", default=str(FULL_TRACE if FULL_TRACE.exists() else SAMPLE_TRACE))
    p.add_argument("--model-dir", default=str(REPO / "build" / "tiny-llama"))
    p.add_argument("--workloads", nargs="+", default=["conversations", "agents"],
                   choices=["conversations", "agents"])
    p.add_argument("--contenders", nargs="+", metavar="NAME",
                   help="default: the first three (--quick: make demo's pair); of: "
                        + "; ".join(c.name for c in CONTENDERS))
    p.add_argument("--reverse", action="store_true",
                   help="run the contenders in reverse order (ours first)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run everything this many times, each repeat on freshly started "
                        "engines in the other order than the one before")
    p.add_argument("--once", nargs="+", default=[], metavar="NAME",
                   help="of --contenders, those run in the first repeat only")
    p.add_argument("--quick", action="store_true",
                   help="make demo: the [demo] point only (with --contenders: those there)")
    p.add_argument("--point", type=int, metavar="I",
                   help="only the I-th load point of each workload (0: the lightest): a screen")
    p.add_argument("--out", default=str(RESULTS / "pressure.json"))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    by_name = {c.name: c for c in CONTENDERS}
    if args.contenders is None:
        args.contenders = list(DEMO_PAIR if args.quick else DEFAULT_CONTENDERS)
    unknown = [n for n in args.contenders if n not in by_name]
    if unknown:
        raise SystemExit(f"pressure_bench: unknown contender(s) {unknown}")
    if (args.repeats < 1 or not set(args.once) <= set(args.contenders)
            or (args.repeats > 1 and set(args.contenders) <= set(args.once))):
        raise SystemExit("pressure_bench: --repeats must be >= 1 and --once a subset of "
                         "--contenders that leaves some to repeat")
    if args.quick and (args.repeats != 1 or args.once):
        raise SystemExit("pressure_bench: --quick is one run of the headline pair: no --repeats "
                         "or --once")
    cfg = load_config(args.config)
    ensure_model(args.model_dir)
    if args.quick:
        args.workloads, args.repeats = ["conversations"], 1
    pts = [demo_point(cfg, args.trace)] if args.quick else points(cfg, args.workloads, args.trace)
    if args.point is not None:
        pts = [pt for w in args.workloads
               for pt in [p for p in pts if p.workload == w][args.point:args.point + 1]]
    print(f"local capacity per engine: {cfg.device_tokens} device + host tier x"
          f"{cfg.hicache_ratio:g} = {cfg.local_tokens} tokens; L3 pool "
          f"{cfg.pool_capacity_gb:g} GB; {cfg.engines} engines")
    for pt in pts:
        d = pt.describe(cfg.local_tokens)
        print(f"  {pt.workload} @ {pt.load}: {d['requests']} requests over {pt.span_s:.0f} s, "
              f"working set {pt.working_set} tokens = {d['working_set_over_local']:.1f}x one "
              "engine's local capacity", flush=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    started = time.monotonic()
    rows = []
    for rep in range(1, args.repeats + 1):
        names = [n for n in args.contenders if rep == 1 or n not in args.once]
        print(f"=== repeat {rep} of {args.repeats}", flush=True)
        rows += [{**r, "repeat": rep} for r in
                 run(cfg, [by_name[n] for n in names], pts, args.model_dir,
                     REPO / "build" / f"pressure-{stamp}-{rep}", args.reverse != (rep % 2 == 0))]
    print()
    print(table(rows))
    found = verdicts(rows, CONTENDERS[0].name, CONTENDERS[1].name, CONTENDERS[2].name)
    for line in found:
        print(line["text"])
    if args.repeats > 1:
        print("spread over the repeats (min-max, repeats measured):")
        for text in spread(found):
            print("  " + text)
    if args.quick:
        print(demo_sentence(rows, *DEMO_PAIR, pts[0].describe(cfg.local_tokens)))
    out = Path(args.out)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    bench_report.write_json(out, {
        "date": now, "machine": machine(), "config": asdict(cfg), "argv": argv,
        "points": [pt.describe(cfg.local_tokens) for pt in pts],
        "wall_s": time.monotonic() - started, "verdicts": found, "runs": rows})
    for workload in args.workloads:
        mine = [r for r in rows if r.get("workload") == workload and not r.get("skipped")]
        ttfts = {f"{r['contender']} @ {r['load']} #{r['repeat']}":
                 [q["ttft_s"] for q in r["requests_detail"] if q["ttft_s"] is not None]
                 for r in mine}
        bench_report.cdf_plot(ttfts, out.with_name(f"{out.stem}_{workload}_ttft_cdf.png"),
                              f"TTFT CDF, {workload}, cache pressure")
        reuse_chart(mine, out.with_name(f"{out.stem}_{workload}_reuse.png"),
                    f"reuse breakdown, {workload}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
