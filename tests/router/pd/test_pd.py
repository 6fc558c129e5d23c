"""router/pd/protocol.py (pure) and router/pd/orchestrator.py against fake workers
(httpx.MockTransport behind the orchestrator's data-plane interface).

The real-worker checks are in tests/sglang_patch/test_pd_pool_e2e.py / test_pd_native_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from radix_global.index import GlobalIndex
from radix_global.keys import page_keys
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PoolId, Role, Tier, WorkerId
from router.keying.request_body import RequestKind
from router.pd.orchestrator import IndexPoolProbe, PdOrchestrator, PdRejected
from router.pd.protocol import (
    PdConfig,
    PdError,
    PdMode,
    PdUtilization,
    bootstrap_host_of,
    cached_tokens_of,
    native_body,
    prefill_only_body,
    suggest_ratio,
)
from router.routing.contract import RouteRequest, WorkerState
from router.routing.decode_select import DecodeSelector
from router.transport.proxy import UpstreamUnavailable

GEN = RequestKind.GENERATE
NS = Namespace("tiny@1")
PS = 4
IDS = list(range(100, 140))  # 10 pages


def req(rid: str = "r1", tokens: int = len(IDS), out: int | None = 8,
        tbt: float | None = None) -> RouteRequest:
    return RouteRequest(rid, NS, tokens, page_keys(IDS[:tokens], PS), PS,
                        output_tokens_hint=out, tbt_slo_s=tbt)


PREFILL = WorkerState(WorkerId("p0"), NS, role=Role.PREFILL, url="http://p0")


def decodes(headroom: int | None = 10_000, running: int = 0, n: int = 2) -> list[WorkerState]:
    return [WorkerState(WorkerId(f"d{i}"), NS, role=Role.DECODE, url=f"http://d{i}",
                        kv_headroom_tokens=headroom, running=running) for i in range(n)]


# --- pure bodies ---------------------------------------------------------------------------------

def test_native_body_carries_sglang_bootstrap_fields() -> None:
    body = native_body({"text": "hi", "sampling_params": {"max_new_tokens": 4}}, None,
                       "http://10.0.0.5:30000", 8998, 1234)
    assert (body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"]) == (
        "10.0.0.5", 8998, 1234)
    batch = native_body({"text": ["a", "b", "c"]}, 3, "http://h:1", 9, 7)
    assert batch["bootstrap_host"] == ["h"] * 3 and batch["bootstrap_port"] == [9] * 3
    assert batch["bootstrap_room"][0] == 7 and len(set(batch["bootstrap_room"])) == 3
    assert bootstrap_host_of("http://[::1]:8000") == "[::1]"
    with pytest.raises(PdError):
        native_body({"text": "x"}, None, "http://h:1", 0, 1)


def test_prefill_only_body_asks_for_one_token_and_keeps_the_prompt() -> None:
    payload = {"input_ids": IDS, "stream": True,
               "sampling_params": {"max_new_tokens": 64, "temperature": 0, "min_new_tokens": 9}}
    body = prefill_only_body(payload, RequestKind.GENERATE, "abc")
    assert body["sampling_params"] == {"max_new_tokens": 1, "temperature": 0}
    assert body["stream"] is False and body["input_ids"] == IDS and body["rid"] == "abc-prefill"
    assert payload["sampling_params"]["max_new_tokens"] == 64  # the client's body is untouched
    chat = prefill_only_body({"messages": [], "max_completion_tokens": 50}, RequestKind.CHAT, "c")
    assert chat["max_tokens"] == 1 and "max_completion_tokens" not in chat
    assert prefill_only_body({"prompt": "x", "max_tokens": 9}, RequestKind.COMPLETION,
                             "d")["max_tokens"] == 1
    with pytest.raises(PdError):
        prefill_only_body({"sampling_params": 3}, RequestKind.GENERATE, "e")


def test_cached_tokens_of_reads_sglang_and_openai_answers() -> None:
    sgl = {"meta_info": {"prompt_tokens": 40, "cached_tokens": 36,
                         "cached_tokens_details": {"device": 0, "storage": 36}}}
    assert cached_tokens_of(sgl) == (40, 36, 36)
    oai = {"usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 12}}}
    assert cached_tokens_of(oai) == (40, 12, None)
    assert cached_tokens_of("nope") == (None, None, None)


def test_ratio_config_and_suggestion() -> None:
    cfg = PdConfig.parse_ratio("1:3")
    assert (cfg.prefill_workers, cfg.decode_workers, cfg.prefill_share) == (1, 3, 0.25)
    for bad in ("1", "a:b", "0:2"):
        with pytest.raises(PdError):
            PdConfig.parse_ratio(bad)
    assert suggest_ratio(30.0, 10.0, 4) == "3:1"
    assert suggest_ratio(0.0, 50.0, 4) == "1:3"  # never zero workers of a role
    assert suggest_ratio(0.0, 0.0, 5) == "2:3"


def test_utilization_report_counts_overlaps_once_and_idle_workers() -> None:
    u = PdUtilization(PdConfig(ratio="1:2"), window_s=10.0)
    u.known_workers([(WorkerId("d1"), Role.DECODE)])
    u.begin(WorkerId("p0"), Role.PREFILL, 0.0)
    u.begin(WorkerId("p0"), Role.PREFILL, 1.0)  # overlapping: busy once
    u.end(WorkerId("p0"), 2.0)
    u.end(WorkerId("p0"), 4.0)
    u.begin(WorkerId("d0"), Role.DECODE, 4.0)  # still open at report time
    r = u.report(10.0)
    assert r.prefill.busy_s == pytest.approx(4.0) and r.prefill.utilization == pytest.approx(0.4)
    assert r.decode.workers == 2 and r.decode.busy_s == pytest.approx(6.0)
    assert r.decode.utilization == pytest.approx(0.3)
    assert r.configured_ratio == "1:2" and r.suggested_ratio == "1:2"
    assert u.report(30.0).prefill.busy_s == 0.0  # out of the window


# --- orchestration against fake workers ----------------------------------------------------------

class FakeCluster:
    """Answers like SGLang /generate; decode workers listed in ``dead`` refuse connections."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.dead: set[str] = set()

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        body = json.loads(request.content)
        self.calls.append((host, body))
        if host in self.dead:
            raise httpx.ConnectError("connection refused", request=request)
        n = body["sampling_params"]["max_new_tokens"]
        cached = 0 if host.startswith("p") else len(body["input_ids"]) - 1
        return httpx.Response(200, json={
            "output_ids": list(range(n)),
            "meta_info": {"prompt_tokens": len(body["input_ids"]), "cached_tokens": cached,
                          "cached_tokens_details": {"device": 0, "storage": cached}}})


class MockAnswer:
    def __init__(self, resp: httpx.Response) -> None:
        self.status_code, self.headers, self.content = resp.status_code, [], resp.content

    async def aiter_raw(self) -> Any:
        yield self.content

    async def aclose(self) -> None:
        pass


class MockPlane:
    """The orchestrator's data plane (the router's Proxy in production) over MockTransport:
    a refused connection is ``UpstreamUnavailable``, as the proxy raises it."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.client = httpx.AsyncClient(transport=httpx.MockTransport(cluster.handler))

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> MockAnswer:
        try:
            return MockAnswer(await self.client.post(url, content=body, headers=headers))
        except httpx.ConnectError as exc:
            raise UpstreamUnavailable(str(exc)) from exc

    open_stream = post


def orchestrator(cluster: FakeCluster, probe: Any = None,
                 selector: DecodeSelector | None = None, **kw: Any) -> PdOrchestrator:
    return PdOrchestrator(MockPlane(cluster), PdConfig(mode=PdMode.POOL,  # type: ignore[arg-type]
                                                       pool_ready_timeout_s=1.0),
                          selector, probe, **kw)


async def collect(run: Any) -> bytes:
    return b"".join([c async for c in run.chunks()])


PAYLOAD = {"input_ids": IDS, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}


@pytest.mark.asyncio
async def test_pool_handoff_prefills_one_token_then_decodes_on_the_reserved_worker() -> None:
    cluster = FakeCluster()
    orch = orchestrator(cluster)
    run = orch.start(req(), PAYLOAD, GEN, "/generate", PREFILL, decodes(), stream=False)
    assert orch.selector.reserved_tokens((WorkerId("d0"), 0)) == len(IDS) + 8  # before prefill
    assert cluster.calls == []
    out = json.loads(await collect(run))
    assert [h for h, _ in cluster.calls] == ["p0", "d0"]
    assert cluster.calls[0][1]["sampling_params"]["max_new_tokens"] == 1
    assert cluster.calls[1][1]["sampling_params"]["max_new_tokens"] == 8
    assert out["output_ids"] == list(range(8))
    s = run.stats
    assert s.decode_worker == "d0" and s.decode_storage_tokens == len(IDS) - 1
    assert s.prefill_cached_tokens == 0 and s.prefill_prompt_tokens == len(IDS)
    assert orch.selector.reserved_tokens((WorkerId("d0"), 0)) == 0  # released at the end


@pytest.mark.asyncio
async def test_dead_decode_worker_is_skipped_without_a_second_prefill() -> None:
    cluster = FakeCluster()
    cluster.dead.add("d0")
    refused: list[str] = []
    answered: list[str] = []
    orch = orchestrator(cluster, on_refused=lambda w, exc: refused.append(w),
                        on_answered=answered.append)
    run = orch.start(req(), PAYLOAD, GEN, "/generate", PREFILL, decodes(), stream=False)
    out = json.loads(await collect(run))
    assert out["output_ids"] == list(range(8))
    assert [h for h, _ in cluster.calls] == ["p0", "d0", "d1"]
    assert run.stats.decode_attempts == ("d0", "d1") and run.stats.decode_worker == "d1"
    # The refusal went to health checking (which removes d0), the answers too.
    assert refused == ["d0"] and answered == ["p0", "d1"]
    assert orch.util.decode_retries == 1
    # The orchestrator keeps no exclusion of its own: once d0 answers again (health checking
    # brought it back) the next request may use it.
    cluster.dead.clear()
    cluster.calls.clear()
    run2 = orch.start(req("r2"), PAYLOAD, GEN, "/generate", PREFILL, decodes(),
                      stream=False)
    await collect(run2)
    assert [h for h, _ in cluster.calls] == ["p0", "d0"]


@pytest.mark.asyncio
async def test_all_decode_workers_dead_ends_with_502_not_a_hang() -> None:
    cluster = FakeCluster()
    cluster.dead.update({"d0", "d1"})
    orch = orchestrator(cluster)
    run = orch.start(req(), PAYLOAD, GEN, "/generate", PREFILL, decodes(), stream=True)
    out = await asyncio.wait_for(collect(run), timeout=5)
    assert b"no decode worker answered" in out and out.endswith(b"data: [DONE]\n\n")
    assert run.status_code == 502


@pytest.mark.asyncio
async def test_saturated_decode_pool_rejects_before_any_prefill() -> None:
    cluster = FakeCluster()
    orch = orchestrator(cluster)
    with pytest.raises(PdRejected) as kv:
        orch.start(req(), PAYLOAD, GEN, "/generate", PREFILL, decodes(headroom=20),
                   stream=False)
    assert kv.value.reason == "decode_kv"
    with pytest.raises(PdRejected) as tbt:  # 400 running: 0.02 + 0.0005 * 401 > 0.1 s
        orch.start(req(tbt=0.1), PAYLOAD, GEN, "/generate", PREFILL,
                   decodes(running=400), stream=False)
    assert tbt.value.reason == "tbt_slo" and tbt.value.predicted_tbt_s > 0.1
    assert cluster.calls == [] and orch.util.rejected_before_prefill == 2


@pytest.mark.asyncio
async def test_reservations_fill_a_decode_worker_then_reject() -> None:
    cluster = FakeCluster()
    orch = orchestrator(cluster)
    need = len(IDS) + 8
    one = decodes(headroom=2 * need, n=1)
    orch.start(req("a"), PAYLOAD, GEN, "/generate", PREFILL, one, stream=False)
    orch.start(req("b"), PAYLOAD, GEN, "/generate", PREFILL, one, stream=False)
    with pytest.raises(PdRejected):  # the first two hold all of d0's free KV, none has run
        orch.start(req("c"), PAYLOAD, GEN, "/generate", PREFILL, one, stream=False)


def test_the_orchestrator_runs_pool_hand_offs_only() -> None:
    # Native PD is the HTTP relay's (tests/router/http/test_app.py); one builder of its bodies.
    with pytest.raises(PdError):
        PdOrchestrator(MockPlane(FakeCluster()), PdConfig(mode=PdMode.NATIVE))  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_pool_wait_uses_the_index_pool_holdings() -> None:
    index = GlobalIndex()
    index.register_namespace(NS, PS)
    pool = PoolId("shm-test")
    r = req()
    probe = IndexPoolProbe(index, pool, clock=lambda: 0.0)
    assert await probe.pages_present(r) == 0
    cluster = FakeCluster()
    ticks = iter(range(1000))

    async def sleep(_: float) -> None:  # the pages appear while the orchestrator waits
        if next(ticks) == 3:
            index.apply(StorePages(NS, Location(pool, 0, Tier.POOL), None, list(r.page_keys)))

    orch = orchestrator(cluster, probe=probe, sleep=sleep)
    run = orch.start(r, PAYLOAD, GEN, "/generate", PREFILL, decodes(), stream=False)
    await collect(run)
    assert run.stats.pool_pages == len(r.page_keys)


@pytest.mark.asyncio
async def test_decode_worker_chosen_by_the_driver_is_kept_with_one_reservation() -> None:
    from router.routing.cost import CostModel
    from router.routing.driver import PolicyDriver
    from router.routing.policies import get_policy

    selector = DecodeSelector()
    driver = PolicyDriver(get_policy("round_robin"), CostModel(), decode=selector)
    slots = [PREFILL, *decodes(n=2)]
    decision = driver.route(req(), slots, 0.0)
    assert decision.accepted and decision.decode_worker_id == "d0"
    cluster = FakeCluster()
    orch = orchestrator(cluster, selector=selector)
    run = orch.start(req(), PAYLOAD, GEN, "/generate", PREFILL, decodes(n=2),
                     stream=False, chosen=decision.decode_worker_id)
    assert selector.reserved_tokens((WorkerId("d0"), 0)) == len(IDS) + 8  # not doubled
    await collect(run)
    assert [h for h, _ in cluster.calls] == ["p0", "d0"]
    driver.finished("r1", True, 1.0)
    assert selector.reserved_tokens((WorkerId("d0"), 0)) == 0
