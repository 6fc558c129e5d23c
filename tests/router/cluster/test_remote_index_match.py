"""``--index URL``: the router asks the remote gRPC index service without blocking its event loop
(router/cluster/remote_index.py ``RemoteIndex.prefetch_match``) and falls back to its local view (an
empty match) on timeout or error, counted per reason. Against a real ``IndexServer`` on loopback.

Negative control: the blocking client used before (``IndexClient.match`` called on the loop)
stalls every other task of the loop for as long as the service does."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from radix_global.client import IndexClient
from radix_global.ops import StorePages
from radix_global.service import IndexServer, ServiceConfig
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId
from router.cluster.remote_index import EMPTY_MATCH, PrefetchedMatches, RemoteIndex
from router.config import RouterConfig
from router.routing.contract import RouteRequest, WorkerState
from router.state import RouterState

NS = Namespace("m@1")
PS = 4
KEYS = [PageKey(100 + i) for i in range(8)]
STALL_S = 1.0
TIMEOUT_S = 0.1


class Service:
    """A real index service on its own loop thread (the router's loop stays free)."""

    def __init__(self) -> None:
        self.server = IndexServer(ServiceConfig(host="127.0.0.1", port=0))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def start(self) -> Service:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def stall(self, seconds: float) -> None:
        """Block the service's loop (a service busy or stuck): its RPCs wait."""
        self.loop.call_soon_threadsafe(time.sleep, seconds)

    def stop(self) -> None:
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.server.stop(0.1), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def service() -> Iterator[Service]:
    svc = Service().start()
    with IndexClient(svc.target) as client:
        client.register_namespace(NS, PS)
        client.apply(StorePages(NS, Location(WorkerId("w0"), 0, Tier.GPU), None, KEYS[:6]))
    try:
        yield svc
    finally:
        svc.stop()


async def _ticks_during(coro_fn, period: float = 0.01) -> tuple[float, int, object]:
    """Run ``coro_fn()`` while a ticker counts on the same loop: (seconds, ticks, result)."""
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            await asyncio.sleep(period)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    t0 = time.monotonic()
    result = await coro_fn()
    seconds = time.monotonic() - t0
    stop.set()
    await task
    return seconds, ticks, result


def test_prefetched_match_is_what_the_policy_reads(service: Service) -> None:
    async def run() -> None:
        remote = RemoteIndex(service.target, match_timeout_s=1.0)
        await remote.start()
        try:
            await remote.prefetch_match(NS, KEYS)
            got = remote.view.match(NS, KEYS, 0.0)
            assert got.matched[(WorkerId("w0"), 0)].gpu == 6 and got.best_pages == 6
            assert remote.served_prefetched == 1 and not remote.fallbacks
        finally:
            await remote.stop()
    asyncio.run(run())


def test_slow_service_times_out_without_blocking_the_loop(service: Service) -> None:
    async def run() -> None:
        remote = RemoteIndex(service.target, match_timeout_s=TIMEOUT_S)
        await remote.start()
        try:
            await remote.prefetch_match(NS, KEYS)  # connect once while the service is quick
            service.stall(STALL_S)
            await asyncio.sleep(0.05)
            seconds, ticks, _ = await _ticks_during(lambda: remote.prefetch_match(NS, KEYS[:5]))
            assert seconds < 0.5 * STALL_S, seconds  # bounded by the timeout, not the stall
            assert ticks >= 0.5 * seconds / 0.01, (ticks, seconds)  # the loop kept running
            assert remote.fallbacks == {"timeout": 1}
            assert remote.view.match(NS, KEYS[:5], 0.0) == EMPTY_MATCH  # local view
            assert remote.fallbacks == {"timeout": 1}  # the failure is counted once
            assert remote.view.match(NS, KEYS[:3], 0.0) == EMPTY_MATCH  # never prefetched
            assert remote.fallbacks == {"timeout": 1, "not_prefetched": 1}
            await asyncio.sleep(STALL_S)
        finally:
            await remote.stop()
    asyncio.run(run())


def test_negative_control_blocking_client_stalls_the_loop(service: Service) -> None:
    async def run() -> None:
        with IndexClient(service.target, timeout_s=5.0) as client:
            client.match(NS, KEYS)
            service.stall(STALL_S)
            await asyncio.sleep(0.05)

            async def blocking() -> object:
                return client.match(NS, KEYS)  # what RemoteIndex.view.match did before

            seconds, ticks, _ = await _ticks_during(blocking)
        assert seconds > 0.5 * STALL_S and ticks <= 1, (seconds, ticks)
    asyncio.run(run())


def test_service_down_and_refusals_fall_back_counted(service: Service) -> None:
    async def run() -> None:
        remote = RemoteIndex(service.target, match_timeout_s=0.5)
        await remote.start()
        try:
            await remote.prefetch_match(Namespace("unknown@1"), KEYS)  # refused: NOT_FOUND
            assert remote.fallbacks == {"error": 1}
            service.stop()
            t0 = time.monotonic()
            await remote.prefetch_match(NS, KEYS)
            assert time.monotonic() - t0 < 1.0
            assert sum(remote.fallbacks.values()) == 2
            assert remote.view.match(NS, KEYS, 0.0) == EMPTY_MATCH
            assert remote.stats()["match_fallbacks"] == dict(remote.fallbacks)
        finally:
            await remote.stop()
    asyncio.run(run())


def test_router_state_routes_on_the_prefetched_match_and_exports_the_metric(
        service: Service) -> None:
    async def run() -> None:
        state = RouterState(RouterConfig.from_options(index_url=service.target, policy="conductor"))
        await state.index.start()
        try:
            req = RouteRequest("r1", NS, len(KEYS) * PS, KEYS, PS)
            slots = [WorkerState(WorkerId("w0"), NS), WorkerState(WorkerId("w1"), NS)]
            await state.index.prefetch_match(NS, KEYS)
            decision = state.routing.route(req, slots, 0.0)
            assert decision.worker_id == "w0" and decision.prefix_tokens == 6 * PS
            service.stall(STALL_S)
            await asyncio.sleep(0.05)
            await state.index.prefetch_match(NS, KEYS[:7])
            req2 = RouteRequest("r2", NS, 7 * PS, KEYS[:7], PS)
            assert state.routing.route(req2, slots, 0.0).prefix_tokens == 0  # cache-blind
            text = state.metrics.render().decode()
            assert 'radix_global_index_match_fallbacks_total{reason="timeout"} 1.0' in text
            await asyncio.sleep(STALL_S)
        finally:
            await state.index.stop()
            await state.proxy.close()
    asyncio.run(run())


def test_prefetched_matches_lru_and_ttl() -> None:
    cache = PrefetchedMatches(max_entries=2, ttl_s=10.0)
    cache.put("n", [1], EMPTY_MATCH, 0.0)
    cache.put("n", [2], EMPTY_MATCH, 0.0)
    cache.put("n", [3], EMPTY_MATCH, 0.0)
    assert cache.get("n", [1], 1.0) is None and cache.get("n", [3], 1.0) is EMPTY_MATCH
    assert cache.get("n", [3], 11.0) is None and len(cache) == 2
    with pytest.raises(ValueError):
        PrefetchedMatches(max_entries=0)


def test_http_request_path_prefetches_the_match(service: Service, upstreams, router_factory
                                                ) -> None:
    """Through the router's HTTP front end (router/request/handler.py hook): the decision uses the
    service's match, fetched before the policy ran."""
    from radix_global.keys import page_keys
    from radix_global.registration import WorkerInfo

    _, peer = upstreams()
    router = router_factory(index_url=service.target, policy="conductor",
                            heartbeat_timeout_s=600)
    ns = Namespace("tiny@1")
    ids = list(range(1, 26))  # 6 full pages of 4
    with router.client() as c:
        info = WorkerInfo(worker_id="sgl-0", url=peer.url, model="tiny", namespace=ns,
                          page_size=4)
        assert c.post("/admin/workers", content=info_json(info)).status_code == 201
        with IndexClient(service.target) as client:
            client.apply(StorePages(ns, Location(WorkerId("sgl-0"), 0, Tier.GPU), None,
                                    page_keys(ids, 4)[:5]))
        r = c.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200, r.text
        assert int(r.headers["x-radix-prefix-tokens"]) == 20
        stats = c.get("/admin/stats").json()["index"]
    assert stats["matches_prefetched"] == 1 and stats["match_fallbacks"] == {}


def info_json(info: object) -> bytes:
    from radix_global.registration import encode_worker_info

    raw = encode_worker_info(info)  # type: ignore[arg-type]
    return raw.encode() if isinstance(raw, str) else raw


def test_a_router_without_the_services_token_is_warned_once(caplog) -> None:
    """Key queries need the service's token (issue 35): a router without it routes cache-blind,
    and says so once at warning level, naming the option."""
    service = Service()
    service.server = IndexServer(ServiceConfig(host="127.0.0.1", port=0, admin_token="secret"))
    service.start()
    try:
        async def go() -> None:
            index = RemoteIndex(service.target, admin_token="wrong", match_timeout_s=2.0)
            for _ in range(3):
                await index.prefetch_match(NS, KEYS)
            assert index.failed_last[(NS, tuple(KEYS))] == "error"

        with caplog.at_level("WARNING", logger="radix_global.router.index"):
            asyncio.run(go())
        warned = [r for r in caplog.records if "admin token" in r.getMessage()]
        assert len(warned) == 1 and "--admin-token" in warned[0].getMessage()
    finally:
        service.stop()
