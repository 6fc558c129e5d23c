"""``POST /admin/pool-loads`` (docs/interfaces.md, "Where hosts are", "Measured loads"): what a
worker's pool backend reports of its loads moves the router's topology, through the HTTP app."""

from __future__ import annotations

import pytest

from radix_global.types import PageKey, PoolId, WorkerId

WORKER = {"worker_id": "w1", "url": "http://127.0.0.1:9", "model": "m", "namespace": "m@1",
          "page_size": 4, "engine": "other", "pool_id": "shm-h", "place": "zone-a/rack-1"}


def load(first: int, nbytes: int = 1000, seconds: float = 1e-3) -> dict[str, object]:
    return {"first": first, "pages": 2, "bytes": nbytes, "seconds": seconds}


@pytest.fixture
def router(router_factory):
    router = router_factory(workers=())
    with router.client() as c:
        assert c.post("/admin/workers", json=WORKER).status_code == 201
    return router


def test_a_planned_load_moves_the_hosts_memory_path_and_others_are_counted(router):
    state = router.state
    state.loads.planned.add("shm-h", [PageKey(7), PageKey(8)], PoolId("shm-h"), WorkerId("w1"),
                            state.clock())
    with router.client() as c:
        topology = c.get("/admin/stats").json()["topology"]
        assert topology["placed"] == {"w1": "host:127.0.0.1", "shm-h": "host:127.0.0.1"}
        assert {(x["a"], x["b"]) for x in topology["links"]} == {
            ("host:127.0.0.1", "domain:zone-a/rack-1"), ("domain:zone-a/rack-1", "domain:zone-a"),
            ("domain:zone-a", "domain:")}
        # 1 ms a load and 1 GB/s: the host's memory path, measured
        measured = [load(key, nbytes=n * 10**6, seconds=1e-3 + n * 1e-3)
                    for key, n in ((7, 1), (8, 2), (7, 3), (8, 4))]
        r = c.post("/admin/pool-loads", json={"pool_id": "shm-h",
                                               "loads": [*measured, load(99)]})
        assert r.status_code == 200, r.text
        assert r.json() == {"applied": 4, "unattributed": 1, "not_placed": 0, "mixed": 0}
        topology = c.get("/admin/stats").json()["topology"]
        local = topology["local"]["host:127.0.0.1"]
        assert local["bandwidth_Bps"] == pytest.approx(1e9) and local["samples"] == 4
        assert local["overhead_s"] == pytest.approx(1e-3)
        assert topology["loads"] == {"applied": 4, "unattributed": 1}
        metrics = c.get("/metrics").text
    assert 'radix_global_pool_loads_total{outcome="applied"} 4.0' in metrics
    # every load as the backend measured it, attributed or not: the pool's achieved read rate
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines()
                  if line.startswith("radix_global_pool_load"))
    assert float(values['radix_global_pool_load_seconds_total{pool="shm-h"}']) == \
        pytest.approx(0.015)
    assert float(values['radix_global_pool_loaded_bytes_total{pool="shm-h"}']) == 10_001_000


@pytest.mark.parametrize("body", [
    b"not json", b'{"pool_id": "shm-h"}', b'{"pool_id": "", "loads": []}',
    b'{"pool_id": "shm-h", "loads": [], "extra": 1}',
    b'{"pool_id": "shm-h", "loads": [{"first": 1, "pages": 0, "bytes": 1, "seconds": 1}]}',
    b'{"pool_id": "shm-h", "loads": [{"first": 1, "pages": 1, "bytes": 1, "seconds": -1}]}',
    b'{"pool_id": "shm-h", "loads": [{"first": 1, "pages": 1, "bytes": 1, "seconds": 1e999}]}',
    b'{"pool_id": "shm-h", "loads": [{"first": 9223372036854775808, "pages": 1, "bytes": 1, '
    b'"seconds": 1}]}',
    b'{"pool_id": "shm-h", "loads": [' + b",".join(
        [b'{"first": 1, "pages": 1, "bytes": 1, "seconds": 1}'] * 257) + b"]}",
])
def test_a_bad_report_is_a_400_that_changes_nothing(router, body):
    with router.client() as c:
        r = c.post("/admin/pool-loads", content=body)
        assert r.status_code == 400, r.text
        assert "bad pool load report" in r.json()["error"]["message"]
        assert c.get("/admin/stats").json()["topology"]["loads"] == {}


def test_a_pool_no_worker_has_is_a_404(router):
    with router.client() as c:
        r = c.post("/admin/pool-loads", json={"pool_id": "shm-other", "loads": [load(1)]})
    assert r.status_code == 404 and "shm-other" in r.text
