"""Worker registry rules, the registration API (docs/interfaces.md section 2) and liveness."""

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
        other = WorkerInfo(worker_id="sgl-1", url=server.url, model="tiny", namespace="tiny@1",
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
            bad = WorkerInfo(worker_id="sgl-1", url=peer.url, model="other", namespace="tiny@1",
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


def test_a_request_on_a_worker_that_stops_heartbeating_ends_with_an_error_not_a_wait(
        upstreams, router_factory):
    """A worker whose host vanished keeps its connections open (no FIN): when it is removed for
    silence, the request it carries is retried at once instead of waiting for its answer (or
    the 600 s read timeout); with no other worker that is a 503."""
    router = router_factory(admin_token="t", heartbeat_timeout_s=0.5,
                            health_check_interval_s=0.1)
    peer, server = upstreams()
    peer.mode = "slow"  # answers after 5 s
    info = WorkerInfo(worker_id="sgl-0", url=server.url, model="tiny", namespace="tiny@1",
                      page_size=4)
    with router.client() as c:
        assert _register(c, info).status_code == 201
        t0 = time.monotonic()
        r = c.post("/generate", json={"input_ids": [1, 2, 3]}, timeout=30)
        elapsed = time.monotonic() - t0
    assert r.status_code == 503 and "no healthy worker" in r.text, r.text
    assert elapsed < 3.0, elapsed
