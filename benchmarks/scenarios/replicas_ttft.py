"""Several routers, one view (issue 38), on real engines: the conversations workload through 2
routers sharing one view against 1 router, TTFT mean and p90.

One set of our CPU engines (``radix-global sglang --radix-global URL_A,URL_B``: the L3 pool, KV
events; each heartbeats to the first router that answers) stays up for the whole run. Per
configuration and round the engines' caches are flushed and the pool emptied, then:

- ``1``: one router (``--policy conductor``), alone, no coordination service: today's default;
- ``2``: two routers A and B, the same options plus one fresh Redis (``--coordination``),
  the replay's requests sent round robin (request i to router i mod 2, as a round-robin load
  balancer would), so most conversations change routers between turns.

Both replay the same plan (``benchmarks/scenarios/bench.py``'s conversations slice of the trace).
The configurations alternate, the order rotated per round (``--rounds``, default 3); the spread is
the rounds' median (min-max). The check: the 2-router TTFT mean and p90 (median of the rounds)
are no worse than the 1-router rounds' worst (within their range, or below it), and no request
failed.

Run: ``python -m benchmarks.scenarios.replicas_ttft`` (table +
``benchmarks/results/router_replicas_ttft.json``); ``--quick`` for a short plan.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import REPO, RESULTS
from benchmarks.harness.spread import median_spread, rotated, spread_text
from benchmarks.scenarios.bench import (
    SAMPLE_TRACE,
    BenchConfig,
    build_plan,
    clear_pool,
    machine,
    wait_routable,
    warm_up,
)
from radix_global_tools.cluster.local import (
    ClusterError,
    Engines,
    EngineSet,
    LocalCluster,
    Proc,
    RouterSpec,
    flush_caches,
    free_port,
)
from radix_global_tools.replay.client import (
    ClientOptions,
    describe_plan,
    kv_bytes_per_token,
    replay,
)
from radix_global_tools.replay.stats import SloTargets
from sglang_patch.make_model import ensure_model

RESULT = RESULTS / "router_replicas_ttft.json"
CONFIGS = ("1", "2")
METRICS = ("ttft_mean_s", "ttft_p90_s", "prefix_reuse_fraction", "hold_mean_s")
ROUTER_IDS = "ab"


def router_spec(index: int, coordination: str | None, dispatch: str | None = None
                ) -> RouterSpec:
    options = {"--dispatch": dispatch} if dispatch else {}
    if coordination is not None:
        options |= {"--coordination": coordination,
                    "--coordination-router-id": ROUTER_IDS[index]}
    return RouterSpec("ours", "conductor", options)


def num(value: float | None) -> str:
    """A measured value, or ``-`` when a run had nothing to measure it on (no request ok)."""
    return "-" if value is None else f"{value:.3f}"


def no_worse(values: list[float], reference: list[float]) -> bool:
    """``median(values)`` within ``reference``'s range or below it (a TTFT: lower is better)."""
    return median_spread(values)["median"] <= max(reference)


class ReplicaRuns:
    """One engine set; routers and Redis started fresh per configuration and round."""

    def __init__(self, cluster: LocalCluster, cfg: BenchConfig, work: Path,
                 dispatch: str | None = None) -> None:
        self.cluster, self.cfg, self.work, self.dispatch = cluster, cfg, work, dispatch
        self.ports = [free_port() for _ in ROUTER_IDS]
        self.engines: Engines | None = None

    def _routers(self, n: int, coordination: str | None) -> list[Proc]:
        return [self.cluster.start_router(router_spec(i, coordination, self.dispatch), None,
                                          port=self.ports[i],
                                          tag=f"{ROUTER_IDS[i]}-", model_dir=self.cfg.model_dir)
                for i in range(n)]

    def run(self, n: int, plan: list[Any], kv_bytes: int, label: str) -> dict[str, Any]:
        from tests.redis_server import RedisServer

        redis = None
        if n > 1:
            folder = Path(tempfile.mkdtemp(prefix="redis-", dir=self.work))
            redis = RedisServer(folder).start()
        routers: list[Proc] = []
        try:
            routers = self._routers(n, redis.url if redis else None)
            if self.engines is None:  # they register with a router: one must be up first
                spec = EngineSet("ours", self.cfg.model_dir, n=self.cfg.engines,
                                 page_size=self.cfg.page_size)
                urls = ",".join(f"http://127.0.0.1:{p}" for p in self.ports)
                self.engines = self.cluster.start_engines(spec, router_url=urls, tag="ours-")
                warm_up(self.engines)
            refused = flush_caches(self.engines.urls)
            if refused:  # a warm start would bias the comparison: the run is not measured
                raise ClusterError(f"engines refused to flush their caches: {refused}")
            clear_pool(self.engines)
            for router in routers:
                self.cluster.wait_workers(router, len(self.engines.procs))
                wait_routable(router)
            duration = self.cfg.duration_s
            opts = ClientOptions(request_timeout_s=600.0, max_duration_s=duration * 4 + 120)
            slo = SloTargets(self.cfg.ttft_slo_s, self.cfg.tbt_slo_s)
            report = replay(plan, [r.url for r in routers], opts, slo, kv_bytes, label=label)
        finally:
            for router in routers:
                self.cluster.stop(router)
            if redis is not None:
                redis.kill()
        holds = [r.router_hold_s or 0.0 for r in report.results if r.status == "ok"]
        return {**report.summary, "held": sum(1 for h in holds if h > 0),
                "hold_mean_s": sum(holds) / len(holds) if holds else None,
                "requests_detail": [r.to_json() for r in report.results]}


def summarize_rounds(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for n in CONFIGS:
        mine = [r for r in runs if r["routers"] == n]
        row: dict[str, Any] = {"routers": n, "rounds": len(mine),
                               "failed": sum(r["failed"] + r["rejected"] for r in mine)}
        for m in METRICS:
            vals = [r[m] for r in mine if r[m] is not None]
            row[m] = median_spread(vals) if vals else None
            row[m + "_rounds"] = vals
        rows.append(row)
    return rows


def verdict(rows: list[dict[str, Any]]) -> tuple[bool, list[str]]:
    one, two = rows
    lines, met = [], two["failed"] == 0
    for m in ("ttft_mean_s", "ttft_p90_s"):
        if not one[m + "_rounds"] or not two[m + "_rounds"]:
            return False, [f"{m}: not measured"]
        inside = no_worse(two[m + "_rounds"], one[m + "_rounds"])
        met = met and inside
        ratio = two[m]["median"] / one[m]["median"]
        lines.append(f"{m}: 2 routers {spread_text(two[m], '.3f')} s vs 1 router "
                     f"{spread_text(one[m], '.3f')} s ({ratio:.2f}x): "
                     f"{'within or below' if inside else 'ABOVE'} the 1-router spread")
    lines.append(f"failed or rejected requests with 2 routers: {two['failed']}")
    return met, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(SAMPLE_TRACE))
    p.add_argument("--model-dir", default=str(REPO / "build" / "tiny-llama"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="4 conversations over 30 s")
    p.add_argument("--dispatch", default=None, help="every router's --dispatch (default: its "
                   "own, highest_ratio; off: no dispatch gate, to separate its share)")
    p.add_argument("--json", default=str(RESULT))
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    cfg = BenchConfig(args.trace, args.model_dir, conversations=args.conversations,
                      duration_s=args.duration_s, engines=args.engines)
    if args.quick:
        cfg = replace(cfg, conversations=min(cfg.conversations, 4),
                      duration_s=min(cfg.duration_s, 30.0))
    ensure_model(cfg.model_dir)
    plan, scaling = build_plan(cfg)
    described = describe_plan(plan, scaling)
    kv_bytes = kv_bytes_per_token(cfg.model_dir)
    print(f"plan: {described['requests']} requests, {cfg.conversations} conversations, "
          f"{cfg.duration_s:.0f} s, mean prompt {described['mean_prompt_tokens']:.0f} tokens",
          flush=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = REPO / "build" / f"replicas-ttft-{stamp}"
    runs: list[dict[str, Any]] = []
    with LocalCluster(run_dir) as cluster:
        bench = ReplicaRuns(cluster, cfg, run_dir, args.dispatch)
        for r in range(args.rounds):
            for n in rotated(CONFIGS, r):
                summary = bench.run(int(n), plan, kv_bytes, label=f"round {r}, {n} router(s)")
                runs.append({"round": r, "routers": n, **summary})
                print(f"round {r}, {n} router(s): TTFT mean {num(summary['ttft_mean_s'])} s, "
                      f"p90 {num(summary['ttft_p90_s'])} s, reuse "
                      f"{num(summary['prefix_reuse_fraction'])}, held {summary['held']} (mean "
                      f"{num(summary['hold_mean_s'])} s), ok {summary['ok']}, failed "
                      f"{summary['failed']}, rejected {summary['rejected']}", flush=True)
    rows = summarize_rounds(runs)
    print(f"\n{'routers':>7} {'TTFT mean s':>22} {'TTFT p90 s':>22} {'prefix reuse':>22} "
          f"{'gate hold mean s':>22} {'failed':>6}")
    for row in rows:
        cells = [spread_text(row[m], ".3f") if row[m] else "-" for m in METRICS]
        print(f"{row['routers']:>7} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22} "
              f"{cells[3]:>22} {row['failed']:>6}")
    met, lines = verdict(rows)
    lines.append(f"target (2 routers no worse than the 1-router spread, nothing failed): "
                 f"{'MET' if met else 'MISSED'}")
    print("\n".join(lines))
    result = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "machine": machine(), "config": asdict(cfg), "plan": described, "rows": rows,
              "runs": runs, "target_met": met, "lines": lines,
              "command": " ".join(["python -m benchmarks.scenarios.replicas_ttft",
                                   *(argv if argv is not None else sys.argv[1:])])}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
