"""``radix-global bench`` / ``make bench``: side-by-side trace replay on a local CPU cluster.

Headline: what users run today, sglang-router ``cache_aware`` in front of stock SGLang workers
(local radix cache only), against our Conductor in front of workers started with our flag
(``radix-global sglang --radix-global``: HiCache write-through to the shared L3 pool, KV events).
Ablations: sglang-router ``round_robin``; our ``random``, ``round_robin``, ``least_load``,
``approx_cache``, ``conductor`` with the pool off (stock workers that publish KV events, given to
our router as ``--workers``) and on (our workers).

Every contender replays the same plan (``radix_global_tools/replay/client.py``) against 2 engine
processes (``--engines``, at most 3). Between contenders the router is restarted, every engine's
cache is flushed (``/flush_cache``) and the L3 pool emptied. Contenders run grouped by engine kind
(one engine start-up per kind); the headline pair runs first in each group. Outputs: one table,
``benchmarks/results/bench_cluster.json`` (config, per-contender summary and per-request results)
and ``bench_cluster_ttft_cdf.png``. ``--quick``: the headline pair on a short plan (the demo).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import DATA, FULL_TRACE, REPO, RESULTS
from benchmarks.scenarios import bench_report
from radix_global.trace import prompt_text, read_trace, synthesize_prompt
from radix_global_tools.cluster import smg_grpc
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
from radix_global_tools.replay.plan import (
    PlannedRequest,
    ReplayScaling,
    choose_tokens_per_hash_id,
    plan_requests,
    select_conversations,
    time_scale_for,
)
from radix_global_tools.replay.stats import SloTargets
from sglang_patch.make_model import ensure_model

SAMPLE_TRACE = DATA / "conversation_multiturn_sample.jsonl"
POLICIES = ("random", "round_robin", "least_load", "approx_cache", "conductor")


@dataclass(frozen=True)
class Contender:
    name: str
    engines: str  # stock | ours
    router: RouterSpec
    headline: bool = False
    # the replay sends token ids, not text: what the router's users send it (smg's hash index
    # keys tokenized requests only; text ones it balances by load)
    token_ids: bool = False


HEADLINE = (
    Contender("sglang-router cache_aware (stock)", "stock",
              RouterSpec("sglang-router", "cache_aware"), headline=True),
    Contender("conductor + pool (ours)", "ours", RouterSpec("ours", "conductor"), headline=True),
)
ABLATIONS = (
    Contender("sglang-router round_robin (stock)", "stock",
              RouterSpec("sglang-router", "round_robin")),
    *(Contender(f"ours {p}, pool off", "stock", RouterSpec("ours", p)) for p in POLICIES),
    *(Contender(f"ours {p}, pool on", "ours", RouterSpec("ours", p)) for p in POLICIES[:-1]),
)
ALL = HEADLINE + ABLATIONS


@dataclass(frozen=True)
class BenchConfig:
    trace: str
    model_dir: str
    conversations: int = 8
    min_turns: int = 3
    duration_s: float = 90.0
    target_mean_prompt: int = 1024
    max_prompt_tokens: int = 4096
    output_scale: float = 0.05
    max_output_tokens: int = 32
    engines: int = 2
    page_size: int = 16
    ttft_slo_s: float = 5.0
    tbt_slo_s: float = 0.5
    budget_s: float = 1800.0  # contenders that would start after this are skipped
    contenders: tuple[str, ...] = tuple(c.name for c in ALL)


def build_plan(cfg: BenchConfig) -> tuple[list[PlannedRequest], ReplayScaling]:
    trace = select_conversations(list(read_trace(cfg.trace)), cfg.conversations, cfg.min_turns)
    tpb = choose_tokens_per_hash_id(trace, cfg.target_mean_prompt, cfg.page_size,
                                    cfg.max_prompt_tokens)
    scaling = ReplayScaling(tpb, time_scale_for(trace, cfg.duration_s), cfg.output_scale,
                            cfg.max_output_tokens, cfg.max_prompt_tokens)
    return plan_requests(trace, scaling), scaling


def clear_pool(engines: Engines) -> int:
    """Remove every page of the engines' L3 pool (the router's index restarts empty too)."""
    if engines.pool_id is None:
        return 0
    from sglang_patch.pool.shm_pool import ShmPagePool

    try:
        pool = ShmPagePool.open_existing(engines.pool_id, engines.spec.pool_root)
    except Exception:  # the pool is created lazily by the first write: nothing to clear
        return 0
    try:
        return len(pool.clear())
    finally:
        pool.close()


def clear_storage_dir(spec: EngineSet) -> int:
    """Remove every file of the engines' SGLang ``file`` L3 backend (``spec.storage_dir``)."""
    if spec.storage_dir is None:
        return 0
    files = [f for f in Path(spec.storage_dir).glob("*") if f.is_file()]
    for f in files:
        f.unlink(missing_ok=True)
    return len(files)


def warm_up(engines: Engines, requests: int = 2) -> None:
    """A few requests straight to every engine before measuring: the first prefill of a fresh
    engine pays one-time costs (our engines also create the shared-memory pool on the first
    write-through, ~10 s here), which no contender should be charged for."""
    import httpx

    for url in engines.urls:
        for i in range(requests):
            ids = synthesize_prompt([10**9 + i, 10**9 + 100 + i], 1024, 256)
            if smg_grpc.is_grpc(url):  # no HTTP there; it takes token ids
                smg_grpc.generate(url, ids, 2)
                continue
            body = {"text": prompt_text(ids), "sampling_params": {
                "max_new_tokens": 2, "ignore_eos": True, "temperature": 0.0}}
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(url + "/generate", json=body, timeout=600.0)


def wait_routable(router: Proc, timeout_s: float = 120.0, model: str | None = None) -> None:
    """Until a tiny request through the router succeeds: sglang-router answers ``/health``
    before its health checks have activated the workers (503 "no available workers").
    ``model``: sent as the body's "model" (smg in front of gRPC workers routes by it)."""
    import httpx

    body: dict[str, Any] = {"text": prompt_text(synthesize_prompt([10**9 + 7], 16, 16)),
                            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    if model is not None:
        body["model"] = model
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(router.url + "/generate", json=body, timeout=60.0).status_code == 200:
                return
        time.sleep(1.0)
    raise ClusterError(f"{router.name}: no request got through in {timeout_s} s:\n"
                       f"{router.log_tail()}")


class Runner:
    """Runs contenders on one cluster, keeping one engine set at a time. ``specs``: the engine
    set each contender's ``engines`` key names (default: ``stock`` and ``ours`` from ``cfg``)."""

    def __init__(self, cluster: LocalCluster, cfg: BenchConfig,
                 specs: Mapping[str, EngineSet] | None = None) -> None:
        self.cluster, self.cfg = cluster, cfg
        self.specs = dict(specs or {k: EngineSet(k, cfg.model_dir, n=cfg.engines,
                                                 page_size=cfg.page_size)
                                    for k in ("stock", "ours")})
        self.engines: Engines | None = None
        self.current: str | None = None  # the key of the running engine set
        self.router_port = free_port()  # ours engines register here, across router restarts

    def engines_for(self, key: str) -> Engines | None:
        """The running engine set if it is ``key``'s; otherwise stop it and return None."""
        if self.engines is not None and self.current != key:
            self.cluster.stop_engines(self.engines)
            self.engines = None
        return self.engines

    def start_engines(self, key: str) -> Engines:
        spec = self.specs[key]
        t = time.monotonic()
        print(f"starting {spec.n} {key} engines ...", flush=True)
        router_url = f"http://127.0.0.1:{self.router_port}" if spec.kind == "ours" else None
        self.engines = self.cluster.start_engines(spec, router_url=router_url, tag=f"{key}-")
        self.current = key
        print(f"  engines up in {time.monotonic() - t:.0f} s", flush=True)
        warm_up(self.engines)
        flush_caches(self.engines.urls)
        clear_pool(self.engines)
        clear_storage_dir(spec)
        return self.engines

    def prepare(self, c: Contender) -> tuple[Engines, Proc, dict[str, Any]]:
        """Engines of the contender's set with empty caches, and its router in front.
        Our engines register with the router, so for them the router starts first."""
        engines = self.engines_for(c.engines)
        info: dict[str, Any] = {}
        if engines is not None:
            info["flush_refused"] = flush_caches(engines.urls)
            info["pool_pages_cleared"] = clear_pool(engines)
            info["storage_files_cleared"] = clear_storage_dir(engines.spec)
        if engines is None and self.specs[c.engines].kind == "ours":
            router = self.cluster.start_router(c.router, None, port=self.router_port,
                                               tag="ours-", model_dir=self.cfg.model_dir)
            engines = self.start_engines(c.engines)
        else:
            engines = engines or self.start_engines(c.engines)
            router = self.cluster.start_router(c.router, engines, port=self.router_port,
                                               tag=f"{c.router.kind}-")
        if c.router.kind == "ours":
            self.cluster.wait_workers(router, len(engines.procs))
        wait_routable(router, model=model_name(engines))
        return engines, router, info

    def run(self, c: Contender, plan: list[PlannedRequest], kv_bytes: int,
            duration_s: float | None = None) -> dict[str, Any]:
        """Replay ``plan`` (sent over ``duration_s``, default the config's) through ``c``."""
        engines, router, info = self.prepare(c)
        if engines.spec.storage_dir is not None:  # a late write-through would warm the next run
            info["storage_files_at_start"] = storage_files(engines)
        try:
            duration = self.cfg.duration_s if duration_s is None else duration_s
            opts = ClientOptions(request_timeout_s=600.0, max_duration_s=duration * 4 + 120,
                                 model=model_name(engines), token_ids=c.token_ids)
            slo = SloTargets(self.cfg.ttft_slo_s, self.cfg.tbt_slo_s)
            report = replay(plan, router.url, opts, slo, kv_bytes, label=c.name[:28])
        finally:
            self.cluster.stop(router)
        return {"contender": c.name, "headline": c.headline, "engines": c.engines,
                "router": asdict(c.router), "token_ids": c.token_ids, **info, **report.summary,
                "requests_detail": [r.to_json() for r in report.results]}


def model_name(engines: Engines) -> str | None:
    """The "model" each request names, where the router needs one: smg in front of gRPC
    workers serves ``/generate`` only for a model it knows (the ``--model-path`` it was given:
    ``router_argv``); elsewhere none is sent (no other router needs it)."""
    return engines.spec.model_dir if engines.spec.grpc else None


def storage_files(engines: Engines) -> int:
    """Files in the engine set's shared L3 folder (0 without one)."""
    folder = engines.spec.storage_dir
    return 0 if folder is None else sum(1 for f in Path(folder).glob("*") if f.is_file())


def order(contenders: list[Contender]) -> list[Contender]:
    """Headline first within each engine kind; the kind of the first headline first."""
    kinds = ["stock", "ours"]
    return sorted(contenders, key=lambda c: (kinds.index(c.engines), not c.headline))


def run_bench(cfg: BenchConfig, out_json: Path, out_png: Path, run_dir: Path
              ) -> dict[str, Any]:
    plan, scaling = build_plan(cfg)
    described = describe_plan(plan, scaling)
    print(f"plan: {described['requests']} requests from {cfg.conversations} conversations "
          f"(>= {cfg.min_turns} turns) of {cfg.trace}, sends over {cfg.duration_s:.0f} s "
          f"(time x{scaling.time_scale:.4f}); {scaling.tokens_per_hash_id} tokens per hash id -> "
          f"mean prompt {described['mean_prompt_tokens']:.0f} tokens (cut at "
          f"{cfg.max_prompt_tokens}); mean output {described['mean_output_tokens']:.1f} tokens "
          f"(x{cfg.output_scale}, ignore_eos); ideal reuse {ideal_reuse(described):.0%}",
          flush=True)
    kv_bytes = kv_bytes_per_token(cfg.model_dir)
    chosen = order([c for c in ALL if c.name in cfg.contenders])
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with LocalCluster(run_dir) as cluster:
        runner = Runner(cluster, cfg)
        for c in chosen:
            if time.monotonic() - started > cfg.budget_s:
                rows.append({"contender": c.name, "skipped": "time budget spent"})
                continue
            print(f"== {c.name}", flush=True)
            try:
                row = runner.run(c, plan, kv_bytes)
            except ClusterError as exc:
                print(f"  failed: {str(exc)[:2000]}", file=sys.stderr)
                rows.append({"contender": c.name, "skipped": f"cluster error: {str(exc)[:200]}"})
                continue
            rows.append(row)
            print(bench_report.table([row]).splitlines()[-1], flush=True)
    wall = time.monotonic() - started
    print()
    print(bench_report.table(rows))
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    result: dict[str, Any] = {"date": now,
                              "machine": machine(), "config": asdict(cfg), "plan": described,
                              "wall_s": wall, "verdict": verdict(rows), "contenders": rows}
    print(result["verdict"]["text"])
    bench_report.write_json(out_json, result)
    ttfts: dict[str, list[float]] = {}
    for r in rows:
        detail: list[dict[str, Any]] = r.get("requests_detail", [])
        name = r["contender"] + (" [headline]" if r.get("headline") else "")
        ttfts[name] = [q["ttft_s"] for q in detail if q["ttft_s"] is not None]
    png = bench_report.cdf_plot(ttfts, out_png, f"TTFT CDF, {len(plan)} requests, "
                                f"{cfg.engines} CPU engines")
    print(f"wrote {out_json}" + (f" and {png}" if png else ""))
    return result


def ideal_reuse(described: dict[str, Any]) -> float:
    total = described["mean_prompt_tokens"] * described["requests"]
    return float(described["ideal_prefix_tokens"] / total) if total else 0.0


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {r["contender"]: r for r in rows if not r.get("skipped")}
    base, ours = by.get(HEADLINE[0].name), by.get(HEADLINE[1].name)
    if not base or not ours or base.get("ttft_mean_s") is None or ours.get("ttft_mean_s") is None:
        return {"text": "headline: not measured", "beats_mean": None, "beats_p90": None}
    mean_win = ours["ttft_mean_s"] < base["ttft_mean_s"]
    p90_win = ours["ttft_p90_s"] < base["ttft_p90_s"]
    text = (f"headline: conductor+pool TTFT mean {ours['ttft_mean_s']:.2f} s vs "
            f"{base['ttft_mean_s']:.2f} s ({ours['ttft_mean_s'] / base['ttft_mean_s']:.2f}x), "
            f"p90 {ours['ttft_p90_s']:.2f} s vs {base['ttft_p90_s']:.2f} s -> "
            f"{'beats' if mean_win and p90_win else 'does NOT beat'} sglang-router cache_aware "
            "on mean and p90")
    return {"text": text, "beats_mean": mean_win, "beats_p90": p90_win}


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "loadavg_at_end": load}


def build_parser() -> argparse.ArgumentParser:
    d = BenchConfig(trace="", model_dir="")
    p = argparse.ArgumentParser(prog="radix-global bench", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(FULL_TRACE if FULL_TRACE.exists() else SAMPLE_TRACE))
    p.add_argument("--model-dir", default=str(REPO / "build" / "tiny-llama"),
                   help="made with `radix-global make-model` when missing")
    p.add_argument("--quick", action="store_true", help="headline pair, short plan (demo)")
    p.add_argument("--contenders", nargs="+", default=None, metavar="NAME",
                   help="subset of: " + "; ".join(c.name for c in ALL))
    p.add_argument("--headline-only", action="store_true")
    for name in ("conversations", "min_turns", "engines", "target_mean_prompt",
                 "max_output_tokens"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    for name in ("duration_s", "output_scale", "ttft_slo_s", "tbt_slo_s", "budget_s"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(d, name))
    p.add_argument("--out", default=str(RESULTS / "bench_cluster.json"))
    p.add_argument("--plot", default=None, help="PNG path (default: next to --out)")
    p.add_argument("--run-dir", default=None, help="process logs (default: build/bench-<time>)")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    names = [c.name for c in (HEADLINE if args.headline_only or args.quick else ALL)]
    if args.contenders:
        unknown = [n for n in args.contenders if n not in {c.name for c in ALL}]
        if unknown:
            raise SystemExit(f"radix-global bench: unknown contender(s) {unknown}")
        names = list(args.contenders)
    cfg = BenchConfig(args.trace, args.model_dir, args.conversations, args.min_turns,
                      args.duration_s, args.target_mean_prompt, output_scale=args.output_scale,
                      max_output_tokens=args.max_output_tokens, engines=args.engines,
                      ttft_slo_s=args.ttft_slo_s, tbt_slo_s=args.tbt_slo_s,
                      budget_s=args.budget_s, contenders=tuple(names))
    if args.quick:
        cfg = replace(cfg, conversations=min(cfg.conversations, 4),
                      duration_s=min(cfg.duration_s, 40.0), budget_s=min(cfg.budget_s, 900.0))
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    cfg = config_from_args(args)
    ensure_model(cfg.model_dir)
    out = Path(args.out)
    png = Path(args.plot) if args.plot else out.with_name(out.stem + "_ttft_cdf.png")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.run_dir) if args.run_dir else REPO / "build" / f"bench-{stamp}"
    with contextlib.suppress(KeyboardInterrupt):
        result = run_bench(cfg, out, png, run_dir)
        return 0 if result["verdict"]["beats_mean"] is not None else 1
    return 130


if __name__ == "__main__":
    sys.exit(main())
