"""PD disaggregation on real SGLang CPU workers: co-located vs pool hand-off vs native PD.

Workers started by ``radix-global sglang`` (tiny make-model Llama, 15.9M parameters, float32,
page size 4). Each request is a fresh prompt (no cache anywhere), streamed, greedy, fixed length:

- ``colocated``: straight to one mixed worker D (prefill + decode in one engine; no KV moves).
- ``pool``: ``router/pd/orchestrator.py`` pool mode: P computes the prompt with one output token and
  writes its pages through to the shared-memory pool; once they are there, D gets the request,
  fetches the prompt from the pool (``wait_complete`` prefetch) and decodes.
- ``native``: SGLang's PD (``--disaggregation-mode prefill|decode``, Mooncake TCP transfer
  engine, our CPU patch ``sglang_patch/pd_cpu.py``), request sent to both with SGLang's bootstrap
  fields (``router/pd/protocol.py::native_body``, as the router's relay sends it). Mooncake
  binds all interfaces, so this phase runs only inside a private network namespace; run the
  whole benchmark as
  ``unshare -n bash -c 'ip link set lo up && .venv/bin/python -m benchmarks.scenarios.pd_bench'``
  (outside one, the native row says so and is skipped).

Phases: colocated + pool share one pair of workers (modes interleaved); native gets its own
pair afterwards (at most 2 SGLang servers at a time). Measured per request, client side: TTFT
(send -> first token event), TBT (mean gap between later token events), end-to-end.
Then, per mode, the same under concurrent load (``--concurrency`` streams per wave, arrivals
``--stagger-s`` apart, so that new prompts' prefills land while earlier streams decode: the
interference disaggregation is meant to remove): TBT mean and p90 over every gap of every
stream, TTFT median. Bytes moved
per request: pool mode = pool bytes written + read (``ShmPagePool.stats()`` deltas x page
bytes); native = prompt tokens x KV bytes per token (computed from the model config: what
Mooncake moves); colocated = 0. Medians over requests.

    python -m benchmarks.scenarios.pd_bench [--requests 6] [--prompt-blocks 16] [--out ...]
        [--concurrency 4 --load-waves 2 --load-output-tokens 48 --stagger-s 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from benchmarks.harness.pd_cluster import (
    NS,
    PAGE,
    REPO,
    PoolProbe,
    in_private_netns,
    kv_bytes_per_token,
    workers,
)
from radix_global import keys, trace
from radix_global.types import Role, WorkerId
from router.keying.request_body import RequestKind
from router.pd.orchestrator import PdOrchestrator
from router.pd.protocol import (
    PREFILL_RID_SUFFIX,
    PdConfig,
    PdMode,
    PdUtilization,
    native_body,
    new_bootstrap_room,
)
from router.routing.contract import RouteRequest, WorkerState
from router.transport.proxy import Proxy, ProxyConfig
from sglang_patch.ports import free_port


async def timed_stream(chunks: Any, t0: float) -> tuple[float, list[float], int]:
    """(TTFT, gaps between token events, tokens) from an SSE byte stream."""
    times: list[float] = []
    buf = b""
    async for chunk in chunks:
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if event.startswith(b"data:") and b"[DONE]" not in event:
                times.append(time.perf_counter())
    if not times:
        raise RuntimeError("no token events in the stream")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return times[0] - t0, gaps, len(times)


class Bench:
    def __init__(self, client: httpx.AsyncClient, urls: dict[str, str], kv_per_token: int,
                 probe: PoolProbe | None, bootstrap: int | None) -> None:
        self.client, self.urls, self.kv = client, urls, kv_per_token
        self.probe = probe
        self.bootstrap = bootstrap
        # The pool hand-off over the router's own data plane; native PD is two plain POSTs.
        self.proxy = Proxy(ProxyConfig(request_timeout_s=600))
        self.orch = PdOrchestrator(self.proxy, PdConfig(mode=PdMode.POOL,
                                                        pool_ready_timeout_s=60), probe=probe)
        self.util = self.orch.util if bootstrap is None else PdUtilization(
            PdConfig(mode=PdMode.NATIVE))

    async def native(self, rid: str, body: dict[str, Any], t0: float
                     ) -> tuple[float, list[float], int]:
        """Both halves at once, with SGLang's bootstrap fields; the decode half is timed."""
        assert self.bootstrap is not None
        pd = native_body(body, None, self.urls["P"], self.bootstrap, new_bootstrap_room())
        p, d = WorkerId("P"), WorkerId("D")
        self.util.begin(p, Role.PREFILL, time.monotonic())
        self.util.begin(d, Role.DECODE, time.monotonic())
        prefill = asyncio.ensure_future(self.client.post(
            self.urls["P"] + "/generate", json={**pd, "rid": rid + PREFILL_RID_SUFFIX,
                                               "stream": False}))
        prefill.add_done_callback(lambda _: self.util.end(p, time.monotonic()))
        try:
            async with self.client.stream("POST", self.urls["D"] + "/generate",
                                          json={**pd, "rid": rid}) as resp:
                return await timed_stream(resp.aiter_bytes(), t0)
        finally:
            self.util.end(d, time.monotonic())
            await prefill

    async def one(self, mode: str, rid: str, ids: list[int], out: int,
                  gaps_out: list[float] | None = None) -> dict[str, Any]:
        body = {"input_ids": ids, "stream": True,
                "sampling_params": {"max_new_tokens": out, "temperature": 0.0,
                                    "ignore_eos": True}}
        before = self.probe.pages_moved() if self.probe else (0, 0)
        t0 = time.perf_counter()
        split: tuple[float | None, float | None] = (None, None)
        if mode == "colocated":
            async with self.client.stream("POST", self.urls["D"] + "/generate",
                                          json=body) as resp:
                ttft, gaps, n = await timed_stream(resp.aiter_bytes(), t0)
        elif mode == "native":
            ttft, gaps, n = await self.native(rid, body, t0)
        else:
            if self.probe is not None:
                self.probe.ids[rid] = ids
            prefill = WorkerState(WorkerId("P"), NS, role=Role.PREFILL, url=self.urls["P"])
            decode = WorkerState(WorkerId("D"), NS, role=Role.DECODE, url=self.urls["D"])
            run = self.orch.start(RouteRequest(rid, NS, len(ids), keys.page_keys(ids, PAGE),
                                               PAGE, output_tokens_hint=out),
                                  body, RequestKind.GENERATE, "/generate", prefill, [decode],
                                  stream=True)
            ttft, gaps, n = await timed_stream(run.chunks(), t0)
            split = (run.stats.prefill_s, run.stats.pool_wait_s)
        e2e = time.perf_counter() - t0
        if gaps_out is not None:
            gaps_out.extend(gaps)
        after = self.probe.pages_moved() if self.probe else (0, 0)
        if mode == "pool":
            moved = (after[0] - before[0] + after[1] - before[1]) * PAGE * self.kv
        elif mode == "native":
            moved = len(ids) * self.kv
        else:
            moved = 0
        return {"mode": mode, "ttft_s": ttft, "tbt_s": statistics.mean(gaps) if gaps else None,
                "e2e_s": e2e, "tokens": n, "bytes_moved": moved,
                "prefill_s": split[0], "pool_wait_s": split[1]}


async def load(b: Bench, mode: str, concurrency: int, waves: int, blocks: int, out: int,
               stagger_s: float, offset: int) -> dict[str, Any]:
    """``waves`` x ``concurrency`` streams, arrivals ``stagger_s`` apart within a wave."""
    gaps: list[float] = []
    rows: list[dict[str, Any]] = []

    async def one(rid: str, ids: list[int], delay: float) -> None:
        await asyncio.sleep(delay)
        rows.append(await b.one(mode, rid, ids, out, gaps_out=gaps))

    t0 = time.perf_counter()
    for w in range(waves):
        ps = prompts(concurrency, blocks, offset + 10_000 * w)
        await asyncio.gather(*(one(f"load-{mode}-{w}-{i}", ids, i * stagger_s)
                               for i, ids in enumerate(ps)))
    gaps.sort()
    return {"mode": mode, "streams": waves * concurrency, "concurrency": concurrency,
            "stagger_s": stagger_s, "output_tokens": out,
            "tbt_s_mean": statistics.mean(gaps) if gaps else None,
            "tbt_s_p90": gaps[int(0.9 * (len(gaps) - 1))] if gaps else None,
            "tbt_s_max": gaps[-1] if gaps else None,
            "ttft_s_median": statistics.median(r["ttft_s"] for r in rows),
            "prefill_s_median": _median(r["prefill_s"] for r in rows),
            "pool_wait_s_median": _median(r["pool_wait_s"] for r in rows),
            "wall_s": time.perf_counter() - t0}


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float | None:
        vals = [r[key] for r in rows if r[key] is not None]
        return statistics.median(vals) if vals else None

    return {"requests": len(rows), "ttft_s_median": med("ttft_s"), "tbt_s_median": med("tbt_s"),
            "e2e_s_median": med("e2e_s"),
            "ttft_s_range": [min(r["ttft_s"] for r in rows), max(r["ttft_s"] for r in rows)],
            "tbt_s_range": [min(r["tbt_s"] or 0 for r in rows), max(r["tbt_s"] or 0
                                                                   for r in rows)],
            "bytes_moved_median": med("bytes_moved")}


def prompts(requests: int, blocks: int, offset: int) -> list[list[int]]:
    return [trace.synthesize_prompt([offset + 100 * i + b for b in range(blocks)],
                                    blocks * 512, 64) for i in range(requests)]


class LoadArgs(NamedTuple):
    concurrency: int
    waves: int
    output_tokens: int
    stagger_s: float


async def run_phase(urls: dict[str, str], modes: tuple[str, ...], kv: int,
                    probe: PoolProbe | None, bootstrap: int | None, requests: int,
                    blocks: int, out: int, la: LoadArgs
                    ) -> tuple[dict[str, list[dict[str, Any]]], Any, dict[str, Any]]:
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    loads: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=5)) as client:
        b = Bench(client, urls, kv, probe, bootstrap)
        for m in modes:  # warm-up (first-request costs), not measured
            await b.one(m, f"warm-{m}", trace.synthesize_prompt([7 + len(m)], 512, 64), 4)
        for i in range(requests):
            order = modes if i % 2 == 0 else tuple(reversed(modes))
            for m in order:
                ids = prompts(1, blocks, 100_000 * (1 + modes.index(m)) + 1000 * i)[0]
                if bootstrap is not None:
                    ids = prompts(1, blocks, 900_000 + 1000 * i)[0]
                rows[m].append(await b.one(m, f"{m}-{i}", ids, out))
        if la.concurrency > 0 and la.waves > 0:
            for k, m in enumerate(modes):
                loads[m] = await load(b, m, la.concurrency, la.waves, blocks, la.output_tokens,
                                      la.stagger_s, 2_000_000 + 500_000 * k
                                      + (3_000_000 if bootstrap is not None else 0))
        report = b.util.report(time.monotonic())
        await b.proxy.close()
    return rows, report, loads


class _Skip(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--prompt-blocks", type=int, default=16, help="64-token blocks per prompt")
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--model", default=None, help="model folder (default: make-model build)")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/pd_bench.json"))
    ap.add_argument("--phases", default="pool,native",
                    help="pool (colocated + pool hand-off), native; a subset is merged into --out")
    ap.add_argument("--concurrency", type=int, default=4, help="streams per load wave; 0 = off")
    ap.add_argument("--load-waves", type=int, default=2)
    ap.add_argument("--load-output-tokens", type=int, default=48)
    ap.add_argument("--stagger-s", type=float, default=0.5, help="arrival gap within a wave")
    args = ap.parse_args()
    la = LoadArgs(args.concurrency, args.load_waves, args.load_output_tokens, args.stagger_s)
    phases = set(args.phases.split(","))
    from sglang_patch.make_model import make_model
    from sglang_patch.pool.shm_pool import destroy_pool

    model = args.model or str(make_model(Path(tempfile.mkdtemp(prefix="pdbench-")) / "tiny"))
    kv = kv_bytes_per_token(model)
    run_dir = Path(tempfile.mkdtemp(prefix="pdbench-run-"))
    rows: dict[str, list[dict[str, Any]]] = {}
    util: dict[str, Any] = {}
    loads: dict[str, Any] = {}
    if Path(args.out).exists() and phases != {"pool", "native"}:
        earlier = json.loads(Path(args.out).read_text())
        rows.update(earlier.get("rows", {}))
        util = earlier.get("utilization", {})
        loads.update(earlier.get("load", {}))
    pool_id = f"pdbench-{uuid.uuid4().hex[:8]}"
    try:
        if "pool" not in phases:
            raise _Skip
        with workers(model, pool_id, run_dir) as urls:
            got, report, got_load = asyncio.run(run_phase(
                urls, ("colocated", "pool"), kv, PoolProbe(pool_id), None, args.requests,
                args.prompt_blocks, args.output_tokens, la))
            rows.update(got)
            loads.update(got_load)
            util = {"prefill": report.prefill.utilization,
                    "decode": report.decode.utilization,
                    "configured_ratio": report.configured_ratio,
                    "suggested_ratio": report.suggested_ratio}
    except _Skip:
        pass
    finally:
        destroy_pool(pool_id)
    native_note = None
    if "native" not in phases:
        native_note = "not run (--phases)" if "native" not in rows else None
    elif in_private_netns():
        pool_id = f"pdbench-{uuid.uuid4().hex[:8]}"
        bootstrap = free_port()
        try:
            with workers(model, pool_id, run_dir, native_bootstrap=bootstrap) as urls:
                got, _, got_load = asyncio.run(run_phase(
                    urls, ("native",), kv, None, bootstrap, args.requests, args.prompt_blocks,
                    args.output_tokens, la))
                rows.update(got)
                loads.update(got_load)
        finally:
            destroy_pool(pool_id)
    else:
        native_note = "skipped: run inside `unshare -n` (Mooncake binds all interfaces)"
    if native_note:
        rows.pop("native", None)
        loads.pop("native", None)
    summary: dict[str, Any] = {m: summarize(r) for m, r in rows.items()}
    if native_note:
        summary["native"] = {"skipped": native_note}
    result = {"summary": summary, "rows": rows, "utilization": util, "load": loads, "config": {
        "requests": args.requests, "prompt_tokens": args.prompt_blocks * 64,
        "output_tokens": args.output_tokens, "page_size": PAGE, "kv_bytes_per_token": kv,
        "load": la._asdict(),
        "model": "make-model tiny Llama 15.9M params float32",
        "machine": f"{os.cpu_count()} CPU cores, shared with other jobs"}}
    print(f"{'mode':<10} {'TTFT med s':>11} {'TBT med ms':>11} {'e2e med s':>10} "
          f"{'bytes/req':>12}")
    for mode in ("colocated", "pool", "native"):
        s = summary.get(mode, {})
        if "skipped" in s or not s:
            print(f"{mode:<10} {s.get('skipped', 'not run')}")
            continue
        print(f"{mode:<10} {s['ttft_s_median']:>11.3f} {(s['tbt_s_median'] or 0) * 1e3:>11.1f} "
              f"{s['e2e_s_median']:>10.3f} {int(s['bytes_moved_median'] or 0):>12,}")
    if loads:
        print(f"under load ({la.concurrency} streams per wave, {la.stagger_s} s apart, "
              f"{la.waves} waves, {la.output_tokens} tokens):")
        print(f"{'mode':<10} {'TBT mean ms':>12} {'TBT p90 ms':>11} {'TBT max ms':>11} "
              f"{'TTFT med s':>11} {'prefill med s':>14} {'pool wait med s':>16}")
        for mode in ("colocated", "pool", "native"):
            x = loads.get(mode)
            if x and x["tbt_s_mean"] is not None:
                print(f"{mode:<10} {x['tbt_s_mean'] * 1e3:>12.1f} {x['tbt_s_p90'] * 1e3:>11.1f} "
                      f"{x['tbt_s_max'] * 1e3:>11.1f} {x['ttft_s_median']:>11.3f} "
                      f"{_fmt(x.get('prefill_s_median')):>14} "
                      f"{_fmt(x.get('pool_wait_s_median')):>16}")
    if util:
        print(f"pool-mode utilisation: prefill {util['prefill']:.2f}, decode "
              f"{util['decode']:.2f}; ratio {util['configured_ratio']} -> suggested "
              f"{util['suggested_ratio']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
