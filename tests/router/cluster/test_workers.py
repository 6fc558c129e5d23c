"""Worker registry rules, the registration API (docs/interfaces.md section
"Worker registration") and liveness."""

from __future__ import annotations

import time

import httpx
import pytest

from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId
from router.cluster.registry import ConflictError, Source, UnknownWorkerError, WorkerRegistry


def _info(wid: str = "w0", page_size: int = 4, model: str = "m", ns: str = "m@1", **kw):
    return WorkerInfo(worker_id=wid, url=f"http://127.0.0.1:1/{wid}", model=model,
                      namespace=ns, page_size=page_size, **kw)


def test_registry_conflicts_are_refused():
    reg = WorkerRegistry()
    reg.add(_info("w0"), Source.REGISTERED, 0.0)
    with pytest.raises(ConflictError, match="page size 4"):
        reg.add(_info("w1", page_size=16), Source.REGISTERED, 0.0)
    with pytest.raises(ConflictError, match="served as namespace m@1"):
        reg.add(_info("w1", ns="m@2"), Source.REGISTERED, 0.0)
    with pytest.raises(ConflictError, match="pool id"):
        reg.add(_info("w1", pool_id="w0"), Source.REGISTERED, 0.0)
    assert [e.info.worker_id for e in reg.all()] == ["w0"]


def test_registry_drain_heartbeat_expiry_and_removal_callback():
    removed: list[str] = []
    reg = WorkerRegistry(on_removed=lambda e: removed.append(e.info.worker_id))
    reg.add(_info("w0"), Source.REGISTERED, 0.0)
    reg.add(_info("w1"), Source.REGISTERED, 0.0)
    reg.add(_info("cli"), Source.CLI, 0.0)
    assert reg.drain("w0").accepting is False
    reg.heartbeat("w1", 15.0)
    assert [e.info.worker_id for e in reg.expire(21.0, 20.0)] == ["w0"]  # CLI never expires
    assert removed == ["w0"]
    with pytest.raises(UnknownWorkerError):
        reg.heartbeat("w0", 22.0)
    reg.remove("w1")
    assert removed == ["w0", "w1"] and len(reg) == 1


def _register(c: httpx.Client, info: WorkerInfo, token: str = "t") -> httpx.Response:
    from radix_global.registration import encode_worker_info

    return c.post("/admin/workers", content=encode_worker_info(info),
                  headers={"Authorization": f"Bearer {token}"})


def test_registration_api(upstreams, router_factory):
    peer, server = upstreams()
    router = router_factory(admin_token="t", heartbeat_timeout_s=600)
    auth = {"Authorization": "Bearer t"}
    info = WorkerInfo(worker_id="sgl-0", url=server.url, model="tiny", namespace="tiny@1",
                      page_size=4)
    with router.client() as c:
        assert _register(c, info, token="bad").status_code == 401
        assert c.post("/admin/workers", content=b"{", headers=auth).status_code == 400
        r = c.post("/admin/workers", content=b'{"worker_id": "x"}', headers=auth)
        assert r.status_code == 400 and "bad registration" in r.json()["error"]["message"]
        r = _register(c, info)
        assert r.status_code == 201 and r.json() == {"worker_id": "sgl-0"}
        _, server8 = upstreams(page_size=8)  # an engine of another page size, same namespace
        other = WorkerInfo(worker_id="sgl-1", url=server8.url, model="tiny", namespace="tiny@1",
                           page_size=8)
        r = _register(c, other)
        assert r.status_code == 409 and "page size" in r.json()["error"]["message"]
        listed = c.get("/admin/workers", headers=auth).json()["workers"]
        assert [w["worker_id"] for w in listed] == ["sgl-0"]
        # the registered worker serves requests; its tokenizer came from its /server_info
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": "hello world"})
        assert r.status_code == 200 and r.headers["x-radix-worker"] == "sgl-0"
        assert router.state.registry.get("sgl-0").model_path == peer.model_path
        assert c.post("/admin/workers/sgl-0/heartbeat", headers=auth).status_code == 200
        assert c.post("/admin/workers/nope/heartbeat", headers=auth).status_code == 404
        assert c.post("/admin/workers/sgl-0/drain", headers=auth).status_code == 200
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": "hello"})
        assert r.status_code == 503  # draining: no new requests
        assert c.delete("/admin/workers/sgl-0", headers=auth).status_code == 200
        assert c.delete("/admin/workers/sgl-0", headers=auth).status_code == 404
        assert c.get("/v1/models").json()["data"] == []


def test_removed_worker_index_entries_are_dropped(upstreams, router_factory):
    router = router_factory(admin_token="t", heartbeat_timeout_s=600)
    _, server = upstreams()
    info = WorkerInfo(worker_id="sgl-0", url=server.url, model="tiny", namespace="tiny@1",
                      page_size=4)
    index = router.state.index.index
    with router.client() as c:
        assert _register(c, info).status_code == 201
        loc = Location(WorkerId("sgl-0"), 0, Tier.GPU)
        index.apply(StorePages(Namespace("tiny@1"), loc, None, [PageKey(1), PageKey(2)]))
        assert index.match(Namespace("tiny@1"), [PageKey(1), PageKey(2)], 0.0).best_pages == 2
        assert c.delete("/admin/workers/sgl-0", headers={"Authorization": "Bearer t"}
                        ).status_code == 200
    assert index.match(Namespace("tiny@1"), [PageKey(1), PageKey(2)], 0.0).best_pages == 0


def test_heartbeat_timeout_removes_registered_worker(upstreams, router_factory):
    router = router_factory(admin_token="t", heartbeat_timeout_s=0.5,
                            health_check_interval_s=0.1)
    _, server = upstreams()
    info = WorkerInfo(worker_id="sgl-0", url=server.url, model="tiny", namespace="tiny@1",
                      page_size=4)
    with router.client() as c:
        assert _register(c, info).status_code == 201
        router.wait_workers(0, timeout=5)
        r = c.post("/admin/workers/sgl-0/heartbeat", headers={"Authorization": "Bearer t"})
        assert r.status_code == 404  # must re-register


def test_failed_cli_worker_leaves_and_rejoins(upstreams, router_factory):
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), health_check_interval_s=0.05,
                            health_failures_to_remove=2)
    router.wait_workers(1)
    peer.healthy = False
    router.wait_workers(0, timeout=5)
    peer.healthy = True
    router.wait_workers(1, timeout=5)
    time.sleep(0.1)
    assert router.state.registry.all()[0].info.model == "tiny"


def test_router_with_standalone_index_service(upstreams, router_factory):
    """``--index``: workers registered at the router are registered at the index service."""
    import asyncio
    import threading

    from radix_global.service import IndexServer, ServiceConfig

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(
        IndexServer(ServiceConfig(admin_token="t")).start(), loop).result(30)
    try:
        _, peer = upstreams()
        router = router_factory(admin_token="t", index_url=f"127.0.0.1:{server.port}",
                                policy="conductor", heartbeat_timeout_s=600)
        info = WorkerInfo(worker_id="sgl-0", url=peer.url, model="tiny", namespace="tiny@1",
                          page_size=4)
        with router.client() as c:
            assert _register(c, info).status_code == 201
            stats = c.get("/admin/stats", headers={"Authorization": "Bearer t"}).json()
            assert stats["index"]["mode"] == "service"
            assert stats["index"]["service"]["workers"] == 1
            r = c.post("/generate", json={"input_ids": list(range(1, 20))})
            assert r.status_code == 200 and r.headers["x-radix-worker"] == "sgl-0"
            _, peer8 = upstreams(page_size=8)  # an engine that does use 8
            bad = WorkerInfo(worker_id="sgl-1", url=peer8.url, model="other", namespace="tiny@1",
                             page_size=8)
            assert _register(c, bad).status_code == 409  # the service refuses the page size
            assert c.delete("/admin/workers/sgl-0", headers={"Authorization": "Bearer t"}
                            ).status_code == 200
            stats = c.get("/admin/stats", headers={"Authorization": "Bearer t"}).json()
            assert stats["index"]["service"]["workers"] == 0
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_request_on_a_worker_that_stops_heartbeating_is_retried_when_it_is_removed(
        upstreams, router_factory):
    """A worker whose host vanished keeps its connections open (no FIN): when it is removed for
    silence, the request it carries (no answer begun) goes to another worker at once, instead
    of waiting for an answer that never comes (or the 600 s read timeout)."""
    import threading

    router = router_factory(admin_token="t", heartbeat_timeout_s=0.8,
                            health_check_interval_s=0.1)
    silent, silent_server = upstreams()
    silent.mode = "slow"  # would answer after 5 s
    _, live_server = upstreams()
    infos = [WorkerInfo(worker_id=f"sgl-{i}", url=server.url, model="tiny", namespace="tiny@1",
                        page_size=4) for i, server in enumerate((silent_server, live_server))]
    stop = threading.Event()
    with router.client() as c:
        assert _register(c, infos[0]).status_code == 201
        t0 = time.monotonic()
        reply: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: reply.append(c.post(
            "/generate", json={"input_ids": [1, 2, 3]}, timeout=30)))
        sender.start()
        deadline = time.monotonic() + 5
        while not silent.requests:  # the silent worker has it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _register(c, infos[1]).status_code == 201

        def beat() -> None:  # sgl-1 stays alive; sgl-0 sends none
            while not stop.wait(0.1):
                c.post("/admin/workers/sgl-1/heartbeat", headers={"Authorization": "Bearer t"})

        beater = threading.Thread(target=beat)
        beater.start()
        sender.join(timeout=30)
        stop.set()
        beater.join()
    elapsed = time.monotonic() - t0
    assert reply[0].status_code == 200, reply[0].text
    assert reply[0].headers["x-radix-worker"] == "sgl-1"
    assert elapsed < 3.0, elapsed


def test_only_a_worker_known_dead_has_its_streams_ended():
    """Refused connects mean the process is gone: its streams are ended (on_dead). Connect
    timeouts may be a busy engine's full accept queue: it is removed, its streams go on."""
    from router.cluster.health import HealthConfig, HealthMonitor

    reg = WorkerRegistry()
    dead: list[str] = []
    monitor = HealthMonitor(reg, HealthConfig(connect_timeouts_to_remove=1), client=None,
                            on_dead=lambda e: dead.append(e.worker_id))
    for wid in ("busy", "gone"):
        reg.add(_info(wid), Source.REGISTERED, 0.0)
    assert monitor.connect_failed("busy", TimeoutError("connect timed out"))
    assert monitor.connect_failed("gone", ConnectionRefusedError("refused"))
    assert reg.all() == [] and dead == ["gone"]
