"""PD hand-off through the L3 pool with real SGLang CPU workers (``router/pd/orchestrator.py``).

Three workers started by ``radix-global sglang`` (``sglang_patch.launch_server``) on one shared
pool: P (prefill role) and D1, D2 (decode role; ``wait_complete`` prefetch). The router side is
the real :class:`PdOrchestrator` over the router's data plane (``Proxy``); "is the prompt in the
pool yet" is read from the shared-memory pool itself (``ShmPoolProbe``), as the index would see it
from pool events.

Checks (one scenario, servers start once; a few minutes on a shared 2-core box):
1. Greedy output of a disaggregated request = a non-disaggregated run of the same prompt
   (reference: the same prompt under another ``cache_salt`` on P, which shares no page with the
   unsalted prompt, so it is computed from scratch in one server).
2. The decode worker reports (nearly) the whole prompt cached, from the pool (``storage``).
3. Multi-turn: turn 2 = turn 1 + answer + new message; the prefill worker computed only the new
   suffix (its ``cached_tokens`` covers turn 1), and turn 2's output equals its reference.
4. D1 is killed with requests reserved on it: they go to D2, all finish, same outputs, no hang.
5. Saturated decode pool (KV headroom = the decode engines' real ``max_total_num_tokens``): the
   request that does not fit is rejected before prefill (P receives nothing).
Negative control: a probe that never waits plus a decode worker whose pool was not written would
show ``storage == 0``; here the assertion ``storage >= ...`` is checked against the value the
engine reports, and test 1 compares against a reference that differs for a different prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pd_workers import PAGE, Worker, kill, prompt, spawn, stop, wait_healthy

from radix_global import keys
from radix_global.types import Namespace, Role, WorkerId
from router.keying.request_body import RequestKind
from router.pd.orchestrator import PdOrchestrator, PdRejected
from router.pd.protocol import PdConfig, PdMode
from router.routing.contract import RouteRequest, WorkerState
from router.transport.proxy import Proxy, ProxyConfig
from sglang_patch.pool.shm_pool import ShmPagePool, destroy_pool

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1500)]

KIND = RequestKind.GENERATE
NS = Namespace("tiny@pd")


@contextlib.contextmanager
def pd_workers(model: Path, pool_id: str, timeout: float = 900) -> Iterator[dict[str, Worker]]:
    """P, D1, D2 started together (start-up overlaps), stopped together."""
    common = ["--radix-global-pool-id", pool_id, "--radix-global-pool-capacity-gb", "0.1",
              "--radix-global-namespace", str(NS)]
    workers = {n: spawn(n, model, [*common, "--radix-global-worker-id", n])
               for n in ("P", "D1", "D2")}
    try:
        wait_healthy(list(workers.values()), timeout)
        yield workers
    finally:
        for w in workers.values():
            stop(w)


class ShmPoolProbe:
    """How many leading pages of a prompt the shared-memory pool holds (the pool's own view)."""

    def __init__(self, pool_id: str, ids_of: dict[str, list[int]]) -> None:
        self.pool_id, self.ids_of = pool_id, ids_of
        self.pool: ShmPagePool | None = None

    async def pages_present(self, req: RouteRequest) -> int:
        if self.pool is None:
            try:
                self.pool = ShmPagePool.open_existing(self.pool_id)
            except Exception:
                return 0
        n = 0
        for digest in keys.page_digests(self.ids_of[req.request_id], PAGE):
            if not self.pool.exists(f"{NS}/{digest.hex()}"):
                break
            n += 1
        return n


def route_request(rid: str, ids: list[int], out: int) -> RouteRequest:
    return RouteRequest(rid, NS, len(ids), keys.page_keys(ids, PAGE), PAGE,
                        output_tokens_hint=out)


def body(ids: list[int], n: int, salt: str | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {"input_ids": ids,
                         "sampling_params": {"max_new_tokens": n, "temperature": 0.0}}
    if salt:
        b["cache_salt"] = salt
    return b


async def direct(client: httpx.AsyncClient, url: str, b: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(url + "/generate", json=b)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


async def disaggregated(orch: PdOrchestrator, probe: ShmPoolProbe, prefill: WorkerState,
                        decodes: list[WorkerState], rid: str, ids: list[int], n: int
                        ) -> tuple[dict[str, Any], Any]:
    probe.ids_of[rid] = ids
    run = orch.start(route_request(rid, ids, n), body(ids, n), KIND, "/generate", prefill,
                     decodes, stream=False)
    raw = b"".join([c async for c in run.chunks()])
    assert run.status_code == 200, raw[:500]
    return json.loads(raw), run.stats


class Recording:
    """The router's data plane, with every URL it sends to recorded."""

    def __init__(self, proxy: Proxy, sent: list[str]) -> None:
        self.proxy, self.sent = proxy, sent

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Any:
        self.sent.append(url)
        return await self.proxy.post(url, body, headers)

    async def open_stream(self, url: str, body: bytes, headers: dict[str, str]) -> Any:
        self.sent.append(url)
        return await self.proxy.open_stream(url, body, headers)


def storage(out: dict[str, Any]) -> int:
    return int((out["meta_info"].get("cached_tokens_details") or {}).get("storage") or 0)


def test_pool_handoff_end_to_end(tiny_model_dir: Path) -> None:
    pool_id = f"pd-{uuid.uuid4().hex[:8]}"
    try:
        with pd_workers(tiny_model_dir, pool_id) as w:
            asyncio.run(_scenario(w, pool_id))
    finally:
        destroy_pool(pool_id)


async def _scenario(w: dict[str, Worker], pool_id: str) -> None:
    sent: list[str] = []

    async def record(request: httpx.Request) -> None:
        sent.append(str(request.url))

    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=5),
                                 event_hooks={"request": [record]}) as client:
        info = (await client.get(w["D1"].url + "/server_info")).json()
        capacity = int(info.get("max_total_num_tokens") or 8192)
        prefill = WorkerState(WorkerId("P"), NS, role=Role.PREFILL, url=w["P"].url)
        decodes = [WorkerState(WorkerId(n), NS, role=Role.DECODE, url=w[n].url,
                               kv_headroom_tokens=capacity, running=0) for n in ("D1", "D2")]
        probe = ShmPoolProbe(pool_id, {})
        proxy = Proxy(ProxyConfig(request_timeout_s=300))  # the router's data plane
        orch = PdOrchestrator(Recording(proxy, sent), PdConfig(mode=PdMode.POOL,
                                                               pool_ready_timeout_s=60),
                              probe=probe)

        # 1 + 2: one disaggregated request vs a from-scratch run of the same prompt.
        turn1 = prompt(list(range(700, 712)))  # 576 tokens
        ref1 = await direct(client, w["P"].url, body(turn1, 16, salt="reference"))
        assert ref1["meta_info"]["cached_tokens"] == 0
        out1, s1 = await disaggregated(orch, probe, prefill, decodes, "t1", turn1, 16)
        assert out1["output_ids"] == ref1["output_ids"]
        assert len(turn1) == 576 and s1.prefill_cached_tokens == 0
        assert s1.pool_pages == len(turn1) // PAGE
        assert storage(out1) >= len(turn1) - 2 * PAGE, out1["meta_info"]
        assert out1["meta_info"]["cached_tokens"] >= len(turn1) - 2 * PAGE

        # 3: turn 2 reuses turn 1 on the prefill worker; only the suffix is computed there.
        turn2 = [*turn1, *out1["output_ids"], *prompt([9100, 9101])]
        ref2 = await direct(client, w["P"].url, body(turn2, 16, salt="reference"))
        out2, s2 = await disaggregated(orch, probe, prefill, decodes, "t2", turn2, 16)
        assert out2["output_ids"] == ref2["output_ids"]
        assert s2.prefill_prompt_tokens == len(turn2)
        assert s2.prefill_cached_tokens is not None
        assert s2.prefill_cached_tokens >= len(turn1) - PAGE, s2  # computed: the new suffix
        assert out2["meta_info"]["cached_tokens"] >= len(turn2) - 2 * PAGE, out2["meta_info"]

        # 4: D1 dies with requests reserved on it: they finish on D2, same outputs, no hang.
        prompts = {f"k{i}": prompt([800 + i, 850 + i])
                   for i in range(4)}
        refs = {r: await direct(client, w["P"].url, body(ids, 8, salt="reference"))
                for r, ids in prompts.items()}
        runs = {}
        for r, ids in prompts.items():
            probe.ids_of[r] = ids
            runs[r] = orch.start(route_request(r, ids, 8), body(ids, 8), KIND,
                                 "/generate", prefill, decodes, stream=False)
        on_d1 = [r for r, run in runs.items() if run.decode.worker_id == "D1"]
        assert on_d1, "the reservations should have spread over both decode workers"
        kill(w["D1"])

        async def finish(run: Any) -> dict[str, Any]:
            return dict(json.loads(b"".join([c async for c in run.chunks()])))

        outs = await asyncio.wait_for(asyncio.gather(*(finish(run) for run in runs.values())),
                                      timeout=600)
        for (r, run), out in zip(runs.items(), outs, strict=True):
            assert out["output_ids"] == refs[r]["output_ids"], r
            assert run.stats.decode_worker == "D2"
        assert all(runs[r].stats.decode_attempts == ("D1", "D2") for r in on_d1)

        # 5: saturated decode pool: rejected before prefill.
        alive = [d for d in decodes if d.worker_id == "D2"]
        big = prompt([990, 991])
        held = []
        per_request = len(big) + 2000
        for i in range(capacity // per_request):
            probe.ids_of[f"h{i}"] = big
            held.append(orch.start(route_request(f"h{i}", big, 2000), body(big, 8), KIND,
                                   "/generate", prefill, alive, stream=False))
        before = list(sent)
        with pytest.raises(PdRejected) as rejected:
            orch.start(route_request("over", big, 2000), body(big, 8), KIND, "/generate",
                       prefill, alive, stream=False)
        assert rejected.value.reason == "decode_kv"
        assert sent == before, "a rejected request must not reach the prefill worker"
        for run in held:  # never run: their reservations and busy intervals given back
            assert orch.selector.release(run.req.request_id)
            orch.util.end(run.decode.worker_id, orch.clock())
        assert orch.selector.reserved_tokens((WorkerId("D2"), 0)) == 0
        report = orch.util.report(time.monotonic())
        assert report.rejected_before_prefill == 1 and report.decode_retries == len(on_d1)
        assert report.prefill.busy_s > 0 and report.decode.busy_s > 0
        await proxy.close()
