"""Two routers over one real Redis (``router/coordination/``): membership, drain, shared
prefixes, the load view, the leader lease, a service outage and hostile records. The workers are
the instant peers of ``tests/router/http_peer.py``; real engines are the end-to-end test's."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from redis_server import RedisServer

from radix_global.types import PageKey, PoolId, WorkerId
from router.cluster.slots import worker_states
from router.coordination.config import CoordinationConfig
from router.coordination.link import Coordinator

FAST = {"coordination_resync_s": 0.2, "coordination_load_publish_s": 0.05,
        "coordination_lease_s": 1.0, "coordination_op_timeout_s": 0.3, "engine_load_poll_s": 0,
        "policy": "least_load"}


def wait_for(check: Callable[[], Any], timeout_s: float = 5.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or check}")


def register(router: Any, url: str, worker_id: str = "w1", **extra: Any) -> None:
    body = {"worker_id": worker_id, "url": url, "model": "tiny", "namespace": "tiny@1",
            "page_size": 4, **extra}
    with router.client() as c:
        r = c.post("/admin/workers", json=body)
        assert r.status_code == 201, r.text


def routers(router_factory: Callable[..., Any], redis: RedisServer, n: int = 2,
            **options: Any) -> list[Any]:
    return [router_factory(coordination_url=redis.url, coordination_router_id=f"r{i}",
                           **{**FAST, **options}) for i in range(n)]


def generate(router: Any, **body: Any) -> httpx.Response:
    with router.client() as c:
        return c.post("/generate", json={"model": "tiny", "text": "hello world", **body})


def test_a_worker_registered_once_is_routed_to_by_both(router_factory, upstreams, redis_server):
    peer, server = upstreams()
    a, b = routers(router_factory, redis_server)
    register(a, server.url)
    wait_for(lambda: b.state.registry.find("w1"), what="the worker on router b")
    assert generate(b).status_code == 200
    assert len(peer.requests) == 1
    # a router that starts later sees it at once (its first read), and is ready only then
    c = router_factory(coordination_url=redis_server.url, coordination_router_id="late", **FAST)
    with c.client() as client:
        wait_for(lambda: client.get("/ready").status_code == 200, what="router c ready")
    assert c.state.registry.find("w1") is not None


def test_negative_control_a_router_alone_does_not_see_it(router_factory, upstreams,
                                                         redis_server):
    _, server = upstreams()
    (a,) = routers(router_factory, redis_server, 1)
    alone = router_factory(**{k: v for k, v in FAST.items() if not k.startswith("coord")})
    register(a, server.url)
    time.sleep(0.5)
    assert alone.state.registry.find("w1") is None
    assert generate(alone).status_code in (404, 503)


def test_drain_and_removal_reach_every_router(router_factory, upstreams, redis_server):
    _, server = upstreams()
    a, b = routers(router_factory, redis_server)
    register(a, server.url)
    entry = wait_for(lambda: b.state.registry.find("w1"))
    with a.client() as c:
        assert c.post("/admin/workers/w1/drain").status_code == 200
    wait_for(lambda: entry.draining, what="drained on b")
    register(a, server.url)  # registering again ends the drain, everywhere
    wait_for(lambda: not b.state.registry.get("w1").draining, what="undrained on b")
    with a.client() as c:
        assert c.delete("/admin/workers/w1").status_code == 200
    wait_for(lambda: b.state.registry.find("w1") is None, what="removed on b")


def test_a_dead_workers_record_expires_everywhere(router_factory, upstreams, redis_server):
    _, server = upstreams()
    a, b = routers(router_factory, redis_server, heartbeat_timeout_s=2.0)
    register(a, server.url)
    wait_for(lambda: b.state.registry.find("w1"))
    with b.client() as c:  # heartbeats to either router keep it alive for both
        for _ in range(12):
            assert c.post("/admin/workers/w1/heartbeat").status_code == 200
            time.sleep(0.25)
    assert a.state.registry.find("w1") is not None
    # gone within the heartbeat timeout and a resync (0.2 s, and slack for a loaded machine)
    # after the last heartbeat; not twice the timeout
    wait_for(lambda: a.state.registry.find("w1") is None and b.state.registry.find("w1") is None,
             timeout_s=2.0 + 0.2 + 0.8 - 0.25, what="both routers dropping the silent worker")


def test_a_deletion_whose_notice_was_lost_is_found_by_the_next_read(router_factory, upstreams,
                                                                     redis_server):
    _, server = upstreams()
    a, b = routers(router_factory, redis_server)
    register(a, server.url)
    with a.client() as c:
        spec = {"name": "sys", "model": "tiny", "token_ids": [1, 2, 3, 4]}
        assert c.post("/admin/shared-prefixes", json=spec).status_code == 201
        assert c.post("/admin/workers/w1/drain").status_code == 200
    entry = wait_for(lambda: b.state.registry.find("w1"))
    wait_for(lambda: entry.draining and len(b.state.shared_prefixes) == 1)
    client = redis_server.client()  # deleted behind the routers' backs: no notice
    client.delete("rg:default:drain:w1", "rg:default:prefix:sys")
    wait_for(lambda: not entry.draining and len(b.state.shared_prefixes) == 0,
             what="b undraining and dropping the prefix at its next read")
    client.delete("rg:default:worker:w1")
    wait_for(lambda: b.state.registry.find("w1") is None, what="b dropping the worker")


def test_a_shared_prefix_registered_on_one_router_reaches_the_other(router_factory, upstreams,
                                                                    redis_server):
    a, b = routers(router_factory, redis_server)
    spec = {"name": "sys", "model": "tiny", "token_ids": list(range(1, 33))}
    with a.client() as c:
        assert c.post("/admin/shared-prefixes", json=spec).status_code == 201
    wait_for(lambda: [s.name for s in b.state.shared_prefixes.specs()] == ["sys"])
    with a.client() as c:
        assert c.delete("/admin/shared-prefixes/sys").status_code == 200
    wait_for(lambda: len(b.state.shared_prefixes) == 0, what="removed on b")


def test_one_routers_in_flight_work_is_in_the_others_view(router_factory, upstreams,
                                                          redis_server):
    peer, server = upstreams()
    a, b = routers(router_factory, redis_server)
    register(a, server.url)
    wait_for(lambda: b.state.registry.find("w1"))
    peer.first_chunk = threading.Event()  # the engine is "prefilling" until set
    slot = (WorkerId("w1"), 0)
    sent = threading.Thread(target=generate, kwargs={"router": a, "stream": True})
    sent.start()
    try:
        start = time.monotonic()
        seen = wait_for(lambda: b.state.view.peer(slot).prefilling == 1, what="a's prefill")
        delay = time.monotonic() - start
        load = b.state.view.peer(slot)
        assert seen and load.requests == 1 and load.prefill_tokens > 0
        assert delay < 1.0  # publication every 0.05 s plus its notice (the record rides on it)
        (state,) = worker_states(b.state.registry.all(), view=b.state.view)
        assert (state.peer_requests, state.peer_prefill_tokens) == (1, load.prefill_tokens)
    finally:
        peer.first_chunk.set()
        sent.join(10)
    wait_for(lambda: b.state.view.peer(slot).empty, what="a's work done in b's view")


class _Nothing:
    """A router with no state (the lease alone is under test)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: [] if name == "owned" else None


def test_exactly_one_router_leads_and_another_takes_over(redis_server):
    config = CoordinationConfig(url=redis_server.url, lease_s=0.6, resync_s=0.2,
                                op_timeout_s=0.3)

    async def run() -> None:
        links = [Coordinator(config, f"r{i}", "v", "d", _Nothing(), dict) for i in range(3)]
        for link in links:
            await link.start()
        await asyncio.sleep(1.0)
        assert sum(link.leads() for link in links) == 1
        (leader,) = [link for link in links if link.leads()]
        async def unreachable() -> None:  # cut off without a goodbye: the lease lapses
            raise ConnectionError("cut off")

        leader.lease.renew = unreachable  # type: ignore[method-assign]
        await asyncio.sleep(1.2)
        assert not leader.leads()
        (second,) = [link for link in links if link.leads()]
        await second.stop()  # a clean stop gives the lease back at once
        await asyncio.sleep(0.5)
        assert [link for link in links if link.leads()] == [
            link for link in links if link not in (leader, second)]
        for link in links:
            await link.stop()

    asyncio.run(run())


def test_the_service_down_routers_keep_routing_and_rejoin(router_factory, upstreams,
                                                          redis_server):
    _, server = upstreams()
    a, b = routers(router_factory, redis_server, heartbeat_timeout_s=1.0)
    register(a, server.url)
    wait_for(lambda: b.state.registry.find("w1"))
    redis_server.kill()
    wait_for(lambda: a.state.view.link.degraded and b.state.view.link.degraded)
    assert sum(a.state.view.link.errors.values()) > 0
    with a.client() as c:  # heartbeats go on, to a only, for longer than the timeout
        for _ in range(10):
            assert c.post("/admin/workers/w1/heartbeat").status_code == 200
            time.sleep(0.25)
    for router in (a, b):  # b routes on its last view: the silence is the service's
        assert router.state.registry.find("w1") is not None
        assert generate(router).status_code == 200
        with router.client() as c:
            assert c.get("/ready").status_code == 200
    redis_server.start()  # empty: the worker's record is written back by the router owning it
    wait_for(lambda: not a.state.view.link.degraded, what="a rejoined")
    wait_for(lambda: redis_server.client().get("rg:default:worker:w1") is not None,
             what="w1 written back")
    late = router_factory(coordination_url=redis_server.url, coordination_router_id="late",
                          heartbeat_timeout_s=1.0, **FAST)
    wait_for(lambda: late.state.registry.find("w1"), what="a router started after the outage")


@pytest.mark.parametrize("key, value", [
    ("rg:default:worker:evil", b"not json"),
    ("rg:default:worker:evil", b"{" + b" " * (2 << 20) + b"}"),
    ("rg:default:worker:evil", b'{"v": 1, "registration": "{}"}'),
    ("rg:default:worker:evil", b'{"v": 2, "registration": ""}'),
    ("rg:default:load:evil", b'{"v": 1, "router_id": "evil", "seq": 1, '
                             b'"slots": [["w1", 0, -5, 0, 0, 0, 0]]}'),
    ("rg:default:prefix:p", b'{"v": 1, "name": "q", "spec": {}}'),
    ("rg:default:link:evil", b'{"v": 1, "router_id": "evil", "links": [{"a": "x", "b": "y", '
                             b'"samples": 4, "w": 1, "x": -1, "y": 1, "xx": 1, "xy": 1}]}'),
    ("rg:default:link:evil", b'{"v": 1, "router_id": "other", "links": []}'),
    ("rg:default:profile:w1:tiny@1", b'{"v": 1, "worker_id": "w1", "namespace": "tiny@1", '
                                      b'"coef": [1.0, "NaN"]}'),
    ("rg:default:profile:w1:tiny@1", b'{"v": 1, "worker_id": "w1", "namespace": "tiny@1", '
                                      b'"coef": [1.0, 2.0]}'),
])
def test_hostile_records_are_refused_and_counted(router_factory, upstreams, redis_server, key,
                                                 value):
    _, server = upstreams()
    (a,) = routers(router_factory, redis_server, 1)
    register(a, server.url)
    client = redis_server.client()
    _, cluster, kind, ident = key.split(":", 3)
    client.set(key, value)
    client.sadd(f"rg:{cluster}:ids:{kind}", ident)  # listed, as a writer of records lists them
    client.set("rg:other:worker:x", b"whatever")  # another cluster's: never read
    client.sadd("rg:other:ids:worker", "x")
    wait_for(lambda: sum(a.state.view.link.refused.values()) > 0, what="a refusal")
    assert [e.info.worker_id for e in a.state.registry.all()] == ["w1"]
    # the reads go on past it: a prefix written after the bad record still arrives
    spec = {"name": "later", "model": "tiny", "token_ids": [1, 2, 3, 4]}
    client.set("rg:default:prefix:later",
               json.dumps({"v": 1, "name": "later", "spec": spec}).encode())
    client.sadd("rg:default:ids:prefix", "later")
    wait_for(lambda: "later" in {s.name for s in a.state.shared_prefixes.specs()})
    assert a.state.view.peer((WorkerId("w1"), 0)).empty
    assert "q" not in {s.name for s in a.state.shared_prefixes.specs()}
    assert a.state.view.link.synced and generate(a).status_code == 200


def test_routers_of_another_config_refuse_to_share(router_factory, redis_server):
    routers(router_factory, redis_server, 1)  # policy least_load
    argv = [sys.executable, "-m", "radix_global_cli", "router", "--port", "0",
            "--coordination", redis_server.url, "--policy", "round_robin"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr[-2000:]  # uvicorn's failed start
    assert "config digest" in done.stderr and "'r0'" in done.stderr


def test_a_router_prices_the_others_work_when_it_places_a_request(router_factory, upstreams,
                                                                  redis_server):
    (busy, busy_server), (idle, idle_server) = upstreams(), upstreams()
    a, b = routers(router_factory, redis_server, policy="conductor")
    register(a, busy_server.url, "w1")
    register(a, idle_server.url, "w2")
    wait_for(lambda: len(b.state.registry) == 2, what="both workers on b")
    busy.first_chunk = threading.Event()
    sent = threading.Thread(target=generate, kwargs={"router": a, "stream": True})
    sent.start()
    try:
        wait_for(lambda: busy.requests, what="a's request on w1 (the tie goes to the first)")
        wait_for(lambda: b.state.view.peer((WorkerId("w1"), 0)).prefilling == 1)
        assert generate(b).status_code == 200
        assert len(idle.requests) == 1  # b saw w1 busy with a's prefill
        # what it saw: a's prefill priced into w1's queue; without the view w1 looks idle
        cost, now = b.state.routing.cost, b.state.clock()
        entries = [b.state.registry.get("w1")]
        (shared,), (alone,) = worker_states(entries, view=b.state.view), worker_states(entries)
        assert cost.queue_s(shared, now) > 0 == cost.queue_s(alone, now)
    finally:
        busy.first_chunk.set()
        sent.join(10)


def test_a_request_held_for_anothers_prefill_leaves_when_that_prefill_ends(
        router_factory, upstreams, redis_server):
    """b holds a request while a's prefill takes the engine's only room (depth 1); a's first
    token, published, releases it at once, not at b's next own event or dispatcher tick (made
    30 s here, so that only the shared view's change can release it in time)."""
    peer, server = upstreams()
    a, b = routers(router_factory, redis_server, policy="conductor", dispatch="fifo",
                   dispatch_depth=1)
    assert b.state.dispatcher is not None
    b.state.dispatcher.tick_s = 30.0
    register(a, server.url)
    wait_for(lambda: b.state.registry.find("w1"))
    peer.first_chunk = threading.Event()
    first = threading.Thread(target=generate, kwargs={"router": a, "stream": True})
    first.start()
    held: list[httpx.Response] = []
    second = threading.Thread(target=lambda: held.append(generate(b, stream=True)))
    try:
        wait_for(lambda: b.state.view.peer((WorkerId("w1"), 0)).prefilling == 1)
        second.start()
        wait_for(lambda: b.state.dispatcher.gate.held() == 1, what="b holding its request")
        released_at = time.monotonic()
        peer.first_chunk.set()
        second.join(10)
        assert held and held[0].status_code == 200
        assert time.monotonic() - released_at < 5.0
        assert float(held[0].headers["x-radix-hold-ms"]) > 0  # it was held, then released
    finally:
        peer.first_chunk.set()
        first.join(10)
        if second.ident is not None:  # started
            second.join(10)


def test_a_link_one_router_measured_prices_the_others_fetches(router_factory, upstreams,
                                                               redis_server):
    """Links shared (docs/interfaces.md, "Where hosts are": several routers): the loads a
    worker reports to r0 measure its host's memory path at r0, and r1 prices on it; r0 stops,
    and r1 is back to the configured figure. With learning off in both, nothing is shared.
    Negative control, run by hand: without ``Kind.LINK`` among the kinds a router reads
    (``router/coordination/link.py::RESYNCED``) this fails waiting for r0's memory path at r1."""
    for learn in (False, True):
        _, server = upstreams()
        a, b = routers(router_factory, redis_server, topology_learn=learn,
                       coordination_cluster=f"learn-{learn}".lower())
        register(a, server.url, pool_id="shm-h", place="rack-1")
        wait_for(lambda b=b: b.state.registry.find("w1"), what="w1 at r1")
        _report_loads(a)
        if not learn:
            time.sleep(3 * FAST["coordination_resync_s"])
            assert _memory_path(a) == {} and _memory_path(b) == {}
            assert redis_server.client().get("rg:learn-false:link:r0") is None
    seen = wait_for(lambda: _memory_path(b).get("peer_samples") == 4 and _memory_path(b),
                    what="r0's memory path at r1")
    assert seen["bandwidth_Bps"] == pytest.approx(1e9) and seen["samples"] == 0
    assert seen["overhead_s"] == pytest.approx(1e-3)
    assert b.state.places.topology.bandwidth_Bps(PoolId("shm-h"), WorkerId("w1")) == \
        pytest.approx(1e9)
    a.server.stop()
    wait_for(lambda: _memory_path(b) == {}, what="r0's links gone from r1")
    assert b.state.places.topology.peers() == []


def _report_loads(router: Any) -> None:
    """Four loads from w1's pool, planned by ``router``: 1 ms a load, then 1 GB/s."""
    state = router.state
    state.loads.planned.add("shm-h", [PageKey(7), PageKey(8)], PoolId("shm-h"), WorkerId("w1"),
                            state.clock())
    loads = [{"first": key, "pages": 2, "bytes": n * 10**6, "seconds": 1e-3 + n * 1e-3}
             for key, n in ((7, 1), (8, 2), (7, 3), (8, 4))]
    with router.client() as c:
        r = c.post("/admin/pool-loads", json={"pool_id": "shm-h", "loads": loads})
    want = 4 if router.state.config.topology.learn else 0
    assert r.status_code == 200 and r.json()["applied"] == want, r.text


def _memory_path(router: Any) -> dict[str, Any]:
    """``router``'s measured memory path of the host every test peer runs on."""
    with router.client() as c:
        local = c.get("/admin/stats").json()["topology"]["local"]
    return dict(local.get("host:127.0.0.1", {}))
