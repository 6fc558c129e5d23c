"""Copies across fault domains, measured (issue 44; ``docs/interfaces.md``, "Where hosts are",
"Copies across fault domains"): reuse and TTFT against the copy budget, the pool capacity the
copies take, and TTFT in the minute after a rack fails, on real SGLang CPU workers over one
Mooncake Store on test hosts.

    python -m benchmarks.scenarios.rack_failure_bench [--budgets 0,1,2] [--repeats 1]
        [--out benchmarks/results/rack_failure.json]

Cluster (``radix_global_tools/cluster/hosts.py``, as root): three racks of one host each (``a``
in r1, ``b`` in r2, ``c`` in r3), each a real SGLang CPU worker on its own Mooncake segment and
registering its rack; the master ``m`` and our router ``r`` on the core. Budget ``k`` extra
copies: ``--copies-domains k+1`` (0: copies off, the default).

Workload (fixed by the seed): an agent platform's traffic, ``PROMPTS`` platform prompts (tool
schemas and instructions, ``PROMPT_TOKENS`` token ids each) with Zipf popularity; each request is
one of them plus a user message of its own and asks for one token, so its latency is its TTFT.
Phases, every request open-loop (Poisson) at ``--rate`` per second, from 8 client threads (a
request waits for a free one while 8 are outstanding; its TTFT counts from its send):

- ``warm``: ``--warm`` requests; the copy rounds run (every second) and then get up to 30 s to
  settle (copies ordered and held);
- rack r1 fails (host ``a``: cable out, processes killed), and the router is waited for to
  remove its worker;
- ``after``: the minute after, ``--rate`` x 60 requests.

Reported per budget and phase: TTFT mean / p90, reuse (engine-reported cached tokens over prompt
tokens), tokens loaded from the pool, failed requests; per budget: copies ordered and held and
their pages (the capacity spent), beside the pages in the index. Beside each measured row, the
simulator's prediction for the same set-up (``radix_global_tools/simulate/segments.py``: three
instances with their own segments in three domains, the CPU calibration, the engines' local
cache and segment sizes, the same requests, the production router policy and copy planner; the
failure ``SIM_GAP_S`` after the last warm arrival, the after phase from the worker's removal).
Table on stdout, JSON to ``--out``; recorded in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.harness.spread import median_spread, rotated, spread_text
from radix_global.keys import page_digests
from radix_global.trace import block_prompt
from radix_global.types import PageKey
from radix_global_tools.cluster.host_cluster import HostCluster, HostProc
from radix_global_tools.cluster.hosts import HostSet
from radix_global_tools.replay.stats import percentile
from radix_global_tools.simulate.config import CPU_CONFIG, load_calibration
from radix_global_tools.simulate.engine import ClusterSpec, Simulation
from radix_global_tools.simulate.experiments import FIG5_SETUPS, make_cost, make_policy
from radix_global_tools.simulate.segments import FaultDomains
from radix_global_tools.simulate.workload import SimRequest
from router.cluster.copy_planner import CopyConfig

PAGE = 16
PROMPTS = 16
PROMPT_TOKENS = 1024
MESSAGE_TOKENS = 32
ZIPF_S = 1.1
RACKS = {"a": "r1", "b": "r2", "c": "r3"}
CORES = {"a": {0}, "b": {1}, "c": {0}}
SETTLE_S = 30.0
HEARTBEAT_S = 4.0  # the router's --heartbeat-timeout-s: how long it takes to remove a failed worker
SIM_GAP_S = 5.0  # simulated: from the last warm arrival to the failure
LOCAL_TOKENS = 2 * 16384  # an engine's device KV pool (HostCluster's) and its host tier of 2x
SEGMENT_TOKENS = int(0.25 * (1 << 30)) // 6144  # its 0.25 GiB segment of the tiny model's KV


def requests(n: int, seed: int, first: int) -> list[tuple[float, int, list[int]]]:
    """``n`` requests (start s, prompt, token ids), Poisson at 1/s (scaled by the caller)."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** ZIPF_S for i in range(PROMPTS)]
    prompts = [block_prompt([50_000 + 100 * p + b for b in range(PROMPT_TOKENS // 128)], 128)
               for p in range(PROMPTS)]
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1.0)
        p = rng.choices(range(PROMPTS), weights)[0]
        out.append((t, p, prompts[p] + block_prompt([8_000_000 + first + i], MESSAGE_TOKENS)))
    return out


def send(c: HostCluster, url: str, plan: list[tuple[float, int, list[int]]], rate: float
         ) -> list[dict[str, Any]]:
    """Each request at its time (open loop, bounded: 120 s each); one row per request."""
    t0 = time.monotonic()

    def one(start: float, prompt: int, ids: list[int]) -> dict[str, Any]:
        time.sleep(max(0.0, start / rate - (time.monotonic() - t0)))
        sent = time.monotonic()
        row: dict[str, Any] = {"prompt": prompt, "tokens": len(ids), "ok": False}
        try:
            r = c.request("POST", url + "/generate", timeout=120.0, json={
                "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        except Exception as e:  # a request lost with the rack: counted, not fatal
            return {**row, "error": repr(e)[:200]}
        row["ttft_s"] = time.monotonic() - sent
        if r.status_code != 200:
            return {**row, "error": f"{r.status_code} {r.text[:200]}"}
        meta = r.json()["meta_info"]
        details = meta.get("cached_tokens_details") or {}
        return {**row, "ok": True, "worker": r.headers.get("x-radix-worker"),
                "cached": int(meta.get("cached_tokens") or 0),
                "storage": int(details.get("storage") or 0)}

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda x: one(*x), plan))


def phase(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    return {
        "requests": len(rows), "failed": len(rows) - len(ok),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "ttft_p90_s": percentile(ttft, 90),
        "reuse": sum(r["cached"] for r in ok) / max(1, sum(r["tokens"] for r in ok)),
        "pool_tokens": sum(r["storage"] for r in ok),
    }


def run_budget(budget: int, args: argparse.Namespace, work: Path, seed: int) -> dict[str, Any]:
    cfg = copy_config(budget)
    copies = ([] if budget == 0 else [
        "--copies-interval-s", str(cfg.interval_s), "--copies-domains", str(cfg.domains),
        "--copies-min-hit-rate-per-s", str(cfg.min_hit_rate)])
    with HostSet(["a", "b", "c", "m", "r"], work / f"b{budget}-{seed}", racks=RACKS) as hosts:
        c = HostCluster(hosts, args.model_dir, client_host="r", page_size=PAGE)
        try:
            master = c.start_mooncake_master("m")
            router = c.start_router("r", options=[
                "--profile-max-tokens", "0", "--heartbeat-timeout-s", str(HEARTBEAT_S),
                "--health-check-interval-s", "0.5", *copies])
            workers: list[HostProc] = [
                c.start_worker(h, router, CORES[h], mooncake=master,
                               extra=["--radix-global-place", rack])
                for h, rack in RACKS.items()]
            c.wait_http(workers)
            c.wait_workers(router, {f"w-{h}" for h in RACKS})

            def stats() -> dict[str, Any]:
                return dict(c.request("GET", router.url + "/admin/stats", admin=True).json())

            warm = send(c, router.url, requests(args.warm, seed, 0), args.rate)
            deadline = time.monotonic() + (SETTLE_S if budget else 0.0)
            while time.monotonic() < deadline and (
                    not (s := stats()["copies"])["held"]
                    or s["held"] < s["outcomes"].get("ordered", 0)):
                time.sleep(1.0)
            before = stats()
            hosts.fail("a")
            failed = time.monotonic()
            c.forget("a")
            while "w-a" in {w["worker_id"] for w in c.workers(router)}:
                if time.monotonic() > failed + 60:
                    raise RuntimeError("the router did not remove the failed rack's worker")
                time.sleep(0.2)
            removed_s = time.monotonic() - failed
            after = send(c, router.url, requests(int(args.rate * 60), seed + 1, 100_000),
                         args.rate)
            return {"budget": budget, "seed": seed, "removed_s": removed_s,
                    "copies": before["copies"],
                    "pool_pages": before["index"].get("pages_stored", 0),
                    "warm": phase(warm), "after": phase(after),
                    "after_by_worker": dict(Counter(str(r.get("worker")) for r in after)),
                    "requests": {"warm": warm, "after": after}}
        finally:
            c.close()


def spread(values: list[Any]) -> dict[str, float] | None:
    known = [float(v) for v in values if v is not None]
    return median_spread(known) if known else None


def copy_config(budget: int) -> CopyConfig:
    return CopyConfig(interval_s=1.0 if budget else 0.0, domains=budget + 1, min_hit_rate=0.02)


def predict(budget: int, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The simulator's run of the same set-up and requests (instances p0..p2 = a, b, c)."""
    cal = load_calibration(CPU_CONFIG)

    def sim_requests(plan: list[tuple[float, int, list[int]]], start_s: float, tag: str
                     ) -> list[SimRequest]:
        return [SimRequest(f"{tag}{i}", start_s + t / args.rate, len(ids), 1, tuple(
            PageKey(int.from_bytes(d[:8], "big")) for d in page_digests(ids, PAGE)))
            for i, (t, _, ids) in enumerate(plan)]

    warm = sim_requests(requests(args.warm, seed, 0), 0.0, "warm")
    fail_at = warm[-1].arrival_s + SIM_GAP_S
    after = sim_requests(requests(int(args.rate * 60), seed + 1, 100_000),
                         fail_at + HEARTBEAT_S, "after")
    spec = ClusterSpec(len(RACKS), cal, LOCAL_TOKENS, True,
                       pool_tokens=len(RACKS) * SEGMENT_TOKENS,
                       fault_domains=FaultDomains(tuple(RACKS.values()), copy_config(budget),
                                                  RACKS["a"], fail_at))
    s = Simulation(spec, make_policy(FIG5_SETUPS["global_cache_aware"], cal, LOCAL_TOKENS),
                   make_cost(cal))
    records = s.run([*warm, *after])
    assert s.rounds is not None

    def sim_phase(tag: str) -> dict[str, Any]:
        return phase([{"ok": r.accepted and r.ttft_s is not None, "ttft_s": r.ttft_s,
                       "tokens": r.input_tokens, "cached": r.local_tokens + r.fetched_tokens,
                       "storage": r.fetched_tokens}
                      for r in records if r.request_id.startswith(tag)])

    return {"budget": budget, "seed": seed, "copies": {"pages": s.rounds.planner.pages()},
            "pool_pages": None, "warm": sim_phase("warm"), "after": sim_phase("after")}


def summary(runs: list[dict[str, Any]], budgets: list[int], source: str
            ) -> list[dict[str, Any]]:
    """Per budget, the median (min-max) over ``runs`` (measured or simulated: ``source``)."""
    rows = []
    for b in budgets:
        mine = [r for r in runs if r["budget"] == b]
        if not mine:
            continue
        rows.append({"budget": b, "source": source, "runs": len(mine),
                     "copy_pages": spread([r["copies"]["pages"] for r in mine]),
                     "pool_pages": spread([r["pool_pages"] for r in mine]),
                     **{f"{p}_{k}": spread([r[p][k] for r in mine]) for p in ("warm", "after")
                        for k in ("ttft_mean_s", "ttft_p90_s", "reuse", "pool_tokens",
                                  "failed")}})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def f(v: dict[str, float] | None, fmt: str) -> str:
        if not v:
            return "-"
        return spread_text(v, fmt) if v["min"] < v["max"] else f"{v['median']:{fmt}}"

    head = ("| extra copies | run | copy pages / index pages | warm TTFT mean / p90 (s) "
            "| warm reuse | after: TTFT mean / p90 (s) | after: reuse | after: pool tokens "
            "| after: failed |")
    lines = [head, "|" + "---|" * 9]
    for r in sorted(rows, key=lambda r: (r["budget"], r["source"])):
        lines.append(
            f"| {r['budget']} | {r['source']} "
            f"| {f(r['copy_pages'], '.0f')} / {f(r['pool_pages'], '.0f')} "
            f"| {f(r['warm_ttft_mean_s'], '.3f')} / {f(r['warm_ttft_p90_s'], '.3f')} "
            f"| {f(r['warm_reuse'], '.2f')} "
            f"| {f(r['after_ttft_mean_s'], '.3f')} / {f(r['after_ttft_p90_s'], '.3f')} "
            f"| {f(r['after_reuse'], '.2f')} | {f(r['after_pool_tokens'], '.0f')} "
            f"| {f(r['after_failed'], '.0f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.rack_failure_bench")
    ap.add_argument("--budgets", default="0,1,2", help="extra copies of a hot prefix, each run")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--warm", type=int, default=48, help="requests before the failure")
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--model-dir", default=None, help="default: radix-global make-model's")
    ap.add_argument("--simulate-only", action="store_true",
                    help="only the simulator's prediction (no engines, no root)")
    ap.add_argument("--out", default="benchmarks/results/rack_failure.json")
    ap.add_argument("--logs", default=None,
                    help="keep the processes' logs in this folder (default: removed)")
    args = ap.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    if any(not 0 <= b < len(RACKS) for b in budgets) or args.repeats < 1 or args.rate <= 0:
        ap.error(f"budgets in 0..{len(RACKS) - 1}, repeats >= 1, rate > 0")
    seeds = [args.seed + 10 * r for r in range(args.repeats)]
    predicted = [predict(b, args, seed) for seed in seeds for b in budgets]
    runs = []
    if not args.simulate_only:
        if args.model_dir is None:
            from sglang_patch.make_model import cached_model

            args.model_dir = str(cached_model())
        with tempfile.TemporaryDirectory(prefix="rack-failure-") as tmp:
            logs = Path(args.logs or tmp)
            for r, seed in enumerate(seeds):
                for b in rotated(budgets, r):
                    run = run_budget(b, args, logs, seed)
                    print(json.dumps({k: run[k] for k in (
                        "budget", "removed_s", "copies", "warm", "after")}), flush=True)
                    runs.append(run)
    rows = summary(runs, budgets, "measured") + summary(predicted, budgets, "simulated")
    print(table(rows))
    Path(args.out).write_text(json.dumps({"argv": sys.argv, "runs": runs,
                                          "predicted": predicted, "summary": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
