"""Our replay client against NVIDIA's aiperf, on the same requests at the same times (issue 42).

    python -m benchmarks.scenarios.client_agreement [--repeats 4] [--contenders NAME ...]
        [--conversations K] [--duration-s S] [--out FILE]

Every TTFT this project reports comes from its own replay client
(``radix_global_tools/replay/client.py``). Here a client nobody here wrote checks it: a
conversation plan of the cache pressure scenario (``benchmarks/data/pressure.toml``; by default
``make demo``'s, its ``[demo]`` point of the shipped trace sample) is exported as an aiperf custom
dataset (prompt text, output length, send time; ``benchmarks/harness/aiperf.py``), and each
contender (default: ``make demo``'s pair, ours and the strongest peer mode) is replayed by both
clients, ``--repeats`` times, the clients' order rotated each repeat, engines' caches flushed and
the L3 tier emptied before every run (engines restarted each repeat). Ours sends SGLang
``/generate`` (``--replay-endpoint completions``: aiperf's OpenAI ``/v1/completions``), aiperf
``/v1/completions``: the same prompt text, tokenized by the engine on both paths.

Verdict (``benchmarks/harness/agreement.py``): per contender, the clients' TTFT mean and p90
(averaged over the repeats) differ by no more than the run-to-run spread; the negative control,
our client's time to the *last* chunk taken as its TTFT, must not. Also printed: how faithfully
each client kept the schedule (largest send skew). Table on stdout, JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness import aiperf
from benchmarks.harness.agreement import RunTimes, agreement, send_skew_s
from benchmarks.harness.paths import REPO, RESULTS
from benchmarks.harness.spread import rotated
from benchmarks.scenarios import bench_report
from benchmarks.scenarios.bench import (
    SAMPLE_TRACE,
    BenchConfig,
    Contender,
    Runner,
    machine,
    storage_files,
)
from benchmarks.scenarios.pressure_bench import CONTENDERS, DEMO_PAIR, ENGINE_ORDER, engine_specs
from benchmarks.scenarios.pressure_plan import DEFAULT_CONFIG, PressureConfig, load_config
from benchmarks.scenarios.pressure_plan import conversation_plan as build_plan
from radix_global_tools.cluster.local import LocalCluster, Proc
from radix_global_tools.replay.client import ClientOptions, replay
from radix_global_tools.replay.completions import PATHS, Endpoint
from radix_global_tools.replay.plan import PlannedRequest
from radix_global_tools.replay.stats import SloTargets
from sglang_patch.make_model import ensure_model

CLIENTS = ("replay", "aiperf")
LAST_CHUNK = "replay, TTFT at the last chunk"  # the negative control


class Clients:
    """Runs one client against a prepared router and returns what it measured."""

    def __init__(self, plan: list[PlannedRequest], cfg: PressureConfig, model_dir: str,
                 work: Path, timeout_s: float, endpoint: Endpoint) -> None:
        self.plan, self.cfg, self.model_dir, self.timeout_s = plan, cfg, model_dir, timeout_s
        self.endpoint = endpoint
        self.work = work
        self.dataset = work / "aiperf_dataset.jsonl"
        aiperf.write_dataset(plan, self.dataset)
        self.tokenizer = aiperf.tokenizer_cache(Path(model_dir), work / "hf")

    def replay(self, router: Proc) -> dict[str, Any]:
        opts = ClientOptions(request_timeout_s=self.timeout_s, max_duration_s=self.timeout_s,
                             model=self.model_dir, endpoint=self.endpoint)
        report = replay(self.plan, router.url, opts,
                        SloTargets(self.cfg.ttft_slo_s, self.cfg.tbt_slo_s), label="replay")
        ok = [r for r in report.results if r.status == "ok"]
        return {"ttfts": [r.ttft_s for r in ok if r.ttft_s is not None],
                "last_chunk": [r.latency_s for r in ok if r.latency_s is not None],
                "sent_s": [r.sent_s for r in report.results],
                "cached_tokens": [r.cached_tokens for r in report.results],
                "workers": [r.worker for r in report.results],
                "failed": len(report.results) - len(ok)}

    def aiperf(self, router: Proc, tag: str) -> dict[str, Any]:
        artifacts = self.work / f"aiperf-{tag}"
        env = {**os.environ, "HF_HOME": str(self.work / "hf"), "HF_HUB_OFFLINE": "1"}
        argv = aiperf.command(router.url, self.dataset, artifacts, self.tokenizer,
                              self.model_dir, self.timeout_s)
        log = self.work / f"aiperf-{tag}.log"
        with log.open("w") as out:
            done = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=self.timeout_s + 300, check=False)
        if done.returncode != 0:
            tail = log.read_text()[-2000:]
            raise aiperf.AiperfError(f"aiperf exited {done.returncode} (log {log}):\n{tail}")
        records = aiperf.read_records(artifacts)
        return {"ttfts": [r.ttft_s for r in records if r.ttft_s is not None],
                "sent_s": [r.sent_s for r in records],
                "cached_tokens": [r.cached_tokens for r in records],
                "failed": sum(1 for r in records if r.ttft_s is None)
                + len(self.plan) - len(records)}


def run_repeat(rep: int, cfg: PressureConfig, contenders: list[Contender], clients: Clients,
               model_dir: str, run_dir: Path, rows: list[dict[str, Any]],
               on_row: Callable[[], None]) -> None:
    """One repeat on freshly started engines: appends a row per run to ``rows`` and calls
    ``on_row`` after each (so a later failure keeps what was measured)."""
    bench_cfg = BenchConfig(trace="", model_dir=model_dir, engines=cfg.engines,
                            page_size=cfg.page_size)
    with (tempfile.TemporaryDirectory(prefix="radix-global-file-l3-", dir="/dev/shm")
          as storage_dir, LocalCluster(run_dir) as cluster):
        runner = Runner(cluster, bench_cfg, engine_specs(cfg, model_dir, storage_dir))
        for c in sorted(contenders, key=lambda c: ENGINE_ORDER.index(c.engines),
                        reverse=rep % 2 == 1):
            for client in rotated(CLIENTS, rep):
                print(f"== repeat {rep} | {c.name} | {client}", flush=True)
                engines, router, info = runner.prepare(c)
                if engines.spec.storage_dir is not None:  # a late write-through warms this run
                    info["storage_files_at_start"] = storage_files(engines)
                try:
                    got = (clients.replay(router) if client == "replay"
                           else clients.aiperf(router, f"{rep}-{len(rows)}"))
                finally:
                    cluster.stop(router)
                planned = [p.send_at_s for p in clients.plan]
                skew = (send_skew_s(planned, got["sent_s"])
                        if len(got["sent_s"]) == len(planned) else None)
                rows.append({"repeat": rep, "contender": c.name, "client": client,
                             "send_skew_s": skew, **info, **got})
                on_row()
                print(f"   {len(got['ttfts'])} ok, {got['failed']} failed, send skew "
                      f"{'-' if skew is None else f'{skew * 1000:.0f} ms'}; caches: {info}",
                      flush=True)


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name in dict.fromkeys(r["contender"] for r in rows):
        mine = [r for r in rows if r["contender"] == name]
        runs = [RunTimes(r["client"], r["repeat"], r["ttfts"]) for r in mine]
        runs += [RunTimes(LAST_CHUNK, r["repeat"], r["last_chunk"]) for r in mine
                 if r["client"] == "replay"]
        for client in ("replay", LAST_CHUNK):
            for a in agreement(runs, client, "aiperf", spread_of=CLIENTS):
                out.append({"contender": name, "client": client, "statistic": a.statistic,
                            "client_s": a.estimate_s, "aiperf_s": a.reference_s,
                            "difference_s": a.difference_s, "spread_s": a.spread_s,
                            "repeats": a.repeats, "agrees": a.agrees})
    return out


COLUMNS = (("contender", "contender", "{}"), ("client", "client", "{}"),
           ("stat", "statistic", "{}"), ("client ms", "client_s", "ms"),
           ("aiperf ms", "aiperf_s", "ms"), ("|diff| ms", "difference_s", "ms"),
           ("spread ms", "spread_s", "ms"), ("agrees", "agrees", "{}"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="client_agreement", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--trace", default=str(SAMPLE_TRACE), help="default: make demo's")
    p.add_argument("--model-dir", default=str(REPO / "build" / "tiny-llama"))
    p.add_argument("--contenders", nargs="+", default=list(DEMO_PAIR), metavar="NAME",
                   help="of: " + "; ".join(c.name for c in CONTENDERS))
    p.add_argument("--repeats", type=int, default=4,
                   help="an even number gives each client the first run after a restart "
                        "equally often")
    p.add_argument("--replay-endpoint", choices=[e.value for e in Endpoint], default="generate",
                   help="our replay's endpoint: SGLang /generate (as in every other benchmark) "
                        "or aiperf's own, OpenAI /v1/completions")
    p.add_argument("--conversations", type=int, help="default: the config's [demo] point")
    p.add_argument("--duration-s", type=float, help="default: the config's [demo] point")
    p.add_argument("--out", default=str(RESULTS / "client_agreement.json"))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    by_name = {c.name: c for c in CONTENDERS}
    unknown = [n for n in args.contenders if n not in by_name]
    if unknown or args.repeats < 2:
        raise SystemExit(f"client_agreement: unknown contender(s) {unknown}" if unknown else
                         "client_agreement: --repeats must be >= 2 (one run has no spread)")
    tokenized = [n for n in args.contenders if by_name[n].token_ids]
    if tokenized:  # aiperf sends text: both clients would not send the same requests
        raise SystemExit(f"client_agreement: {tokenized} are sent token ids, which aiperf "
                         "cannot send")
    cfg = load_config(args.config)
    ensure_model(args.model_dir)
    conv = replace(cfg.conversations,
                   conversations=args.conversations or cfg.demo.conversations)
    duration = args.duration_s or cfg.demo.duration_s
    plan, _ = build_plan(conv, args.trace, cfg.page_size, duration)
    print(f"plan: {len(plan)} requests of {conv.conversations} conversations over "
          f"{duration:.0f} s, open loop; {args.repeats} repeats; our replay over "
          f"{PATHS[Endpoint(args.replay_endpoint)]}", flush=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    work = REPO / "build" / f"client-agreement-{stamp}"
    work.mkdir(parents=True)
    clients = Clients(plan, cfg, args.model_dir, work, timeout_s=duration * 4 + 120,
                      endpoint=Endpoint(args.replay_endpoint))
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    out = Path(args.out)
    head = {"machine": machine(), "argv": argv, "args": vars(args), "revision": revision(),
            "requests": len(plan), "duration_s": duration}

    def write(found: list[dict[str, Any]]) -> None:
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        bench_report.write_json(out, {"date": now, **head, "verdicts": found, "runs": rows,
                                      "wall_s": time.monotonic() - started})

    for rep in range(args.repeats):
        run_repeat(rep, cfg, [by_name[n] for n in args.contenders], clients, args.model_dir,
                   work / f"cluster-{rep}", rows, lambda: write([]))
    found = verdicts(rows)
    write(found)
    print()
    print(bench_report.table(found, COLUMNS, left=3))
    for name in args.contenders:
        for client in CLIENTS:
            skews = [r["send_skew_s"] for r in rows if (r["contender"], r["client"]) == (
                name, client) and r["send_skew_s"] is not None]
            worst = f"{max(skews) * 1000:.0f} ms" if skews else "-"
            print(f"largest send skew, {client} @ {name}: {worst} (all repeats)")
    print(f"wrote {out}")
    return 0


def revision() -> str | None:
    done = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
