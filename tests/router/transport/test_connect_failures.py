"""Request-path connect failures (router/cluster/health.py ``connect_failed``,
router/cluster/registry.py
``ConnectFailures``): a connect timeout is retried on another worker, counted, and evicts only
after ``connect_timeouts_to_remove`` consecutive ones; a refused connection evicts at once
(``connect_refusals_to_remove`` = 1). Real sockets on loopback: a listener whose accept queue is
full (the kernel drops new SYNs, so connects time out) and a closed port (refused)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from radix_global.registration import WorkerInfo, encode_worker_info
from router.cluster.health import connect_failure_kind
from router.cluster.registry import CONNECT_REFUSED, CONNECT_TIMEOUT, ConnectFailures
from router.transport.proxy import Proxy, ProxyConfig, UpstreamUnavailable


@contextlib.contextmanager
def black_hole() -> Iterator[int]:
    """A port that accepts no connection in time: listen(0), never accept, queue filled."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    time.sleep(0.05)
    try:
        yield port
    finally:
        for s in [*fillers, srv]:
            s.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


async def _unavailable(port: int) -> UpstreamUnavailable:
    proxy = Proxy(ProxyConfig(connect_timeout_s=0.3))
    try:
        with pytest.raises(UpstreamUnavailable) as info:
            await proxy.post(f"http://127.0.0.1:{port}/generate", b"{}", {})
        return info.value
    finally:
        await proxy.close()


def test_real_connect_failures_are_classified() -> None:
    with black_hole() as port:
        assert connect_failure_kind(asyncio.run(_unavailable(port))) == CONNECT_TIMEOUT
    assert connect_failure_kind(asyncio.run(_unavailable(closed_port()))) == CONNECT_REFUSED
    assert connect_failure_kind(httpx.ConnectTimeout("t")) == CONNECT_TIMEOUT
    assert connect_failure_kind(ConnectionRefusedError(111, "refused")) == CONNECT_REFUSED


def test_streaks_and_thresholds() -> None:
    f = ConnectFailures(timeouts_to_remove=3, refusals_to_remove=2)
    assert not f.failed("a", CONNECT_TIMEOUT) and not f.failed("a", CONNECT_TIMEOUT)
    f.succeeded("a")  # a good connect ends the streak
    assert not f.failed("a", CONNECT_TIMEOUT) and not f.failed("a", CONNECT_TIMEOUT)
    assert f.failed("a", CONNECT_TIMEOUT) and f.streak("a") == 0  # third in a row: evict
    assert not f.failed("b", CONNECT_REFUSED)
    assert not f.failed("b", CONNECT_TIMEOUT)  # a timeout breaks the refusal streak...
    assert f.failed("b", CONNECT_REFUSED)  # ...but all three failures count to 3
    assert f.counts == {CONNECT_TIMEOUT: 6, CONNECT_REFUSED: 2} and f.evictions == 2
    with pytest.raises(ValueError):
        f.failed("a", "bogus")
    with pytest.raises(ValueError):
        ConnectFailures(timeouts_to_remove=0)


def _register(c: httpx.Client, wid: str, url: str) -> None:
    info = WorkerInfo(worker_id=wid, url=url, model="tiny", namespace="tiny@1", page_size=4)
    assert c.post("/admin/workers", content=encode_worker_info(info)).status_code == 201


def _workers(c: httpx.Client) -> set[str]:
    return {w["worker_id"] for w in c.get("/admin/workers").json()["workers"]}


def test_router_keeps_a_timing_out_worker_retries_elsewhere_and_evicts_after_n(
        upstreams, router_factory) -> None:
    _, peer = upstreams()
    # health_check_timeout_s bounds the /server_info probe at registration (a black hole)
    router = router_factory(connect_timeout_s=0.3, connect_timeouts_to_remove=3,
                            heartbeat_timeout_s=600, max_retries=2, health_check_timeout_s=0.5)
    with black_hole() as port, router.client() as c:
        _register(c, "good", peer.url)
        _register(c, "slow", f"http://127.0.0.1:{port}")
        timeouts = 0
        for i in range(12):
            r = c.post("/generate", json={"input_ids": list(range(1, 9)), "rid": f"r{i}"})
            assert r.status_code == 200 and r.headers["x-radix-worker"] == "good", r.text
            timeouts = router.state.health.connect_failures.counts[CONNECT_TIMEOUT]
            if timeouts == 1:
                assert "slow" in _workers(c)  # one timeout: kept (it was evicted before)
            if timeouts >= 3:
                break
        assert timeouts == 3 and "slow" not in _workers(c)  # third in a row: evicted
        metrics = c.get("/metrics").text
    want = 'radix_global_connect_failures_total{kind="connect_timeout",worker="slow"} 3.0'
    assert want in metrics


def test_router_evicts_a_refusing_worker_at_once(upstreams, router_factory) -> None:
    _, peer = upstreams()
    router = router_factory(heartbeat_timeout_s=600, policy="round_robin")
    with router.client() as c:
        _register(c, "good", peer.url)
        _register(c, "dead", f"http://127.0.0.1:{closed_port()}")
        for i in range(4):
            r = c.post("/generate", json={"input_ids": list(range(1, 9)), "rid": f"q{i}"})
            assert r.status_code == 200, r.text
            if router.state.health.connect_failures.counts[CONNECT_REFUSED]:
                break
        assert router.state.health.connect_failures.counts[CONNECT_REFUSED] == 1
        assert _workers(c) == {"good"}
