"""Copies of hot prefixes in other fault domains, the router's side (router/cluster/
domain_copies.py; docs/interfaces.md, "Where hosts are", "Copies across fault domains"): a hot
prefix held only in rack r1's segment becomes an order for the worker of rack r2, naming SGLang's
storage keys of its pages, handed out once through ``GET /admin/pool-copies``. Workers are real
HTTP peers speaking SGLang's protocol."""

from __future__ import annotations

import time

import pytest

from radix_global.keys import page_digests, page_keys
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PoolId, Tier

PS = 4
PREFIX = list(range(10, 42))  # 8 pages
# two hosts on one machine: "localhost" and "127.0.0.1" are two host names to the router
HOST = {"a": "localhost", "b": "127.0.0.1"}
SEG = {h: f"mooncake-m-1@{HOST[h]}:700{i}" for i, h in enumerate("ab")}


@pytest.mark.parametrize("copies", [True, False])
def test_a_hot_prefix_in_one_rack_is_ordered_into_the_other(upstreams, router_factory,
                                                            copies: bool) -> None:
    peers = {h: upstreams() for h in "ab"}
    router = router_factory(workers=(), policy="conductor",
                            copies_interval_s=0.2 if copies else 0.0,
                            copies_min_hit_rate_per_s=0.01)
    with router.client() as c:
        for h, rack in (("a", "r1"), ("b", "r2")):
            r = c.post("/admin/workers", json={
                "worker_id": f"w{h}", "model": "tiny",
                "url": peers[h][1].url.replace("127.0.0.1", HOST[h]),
                "namespace": "tiny@1", "page_size": PS, "pool_id": SEG[h], "place": rack,
                "kv_bytes_per_token": 100, "pool_capacity_bytes": 100 * PS * 64})  # 64 pages
            assert r.status_code == 201, r.text
        router.wait_workers(2)
        ns = Namespace("tiny@1")
        router.state.index.index.apply(StorePages(ns, Location(PoolId(SEG["a"]), 0, Tier.POOL),
                                                  None, page_keys(PREFIX, PS)))
        for i in range(3):  # the prefix is reused through the pool: hot, and remembered
            r = c.post("/generate", json={"model": "tiny", "input_ids": PREFIX + [60 + i] * 5})
            assert r.status_code == 200, r.text
        # the control asks as long (a round every 0.2 s when on), and must get nothing
        deadline, orders = time.monotonic() + (5 if copies else 1.5), []
        while not orders and time.monotonic() < deadline:
            # a rank that only listens for lost hosts leaves the order to the one that copies
            listening = c.get("/admin/pool-copies", params={"pool_id": SEG["b"], "orders": "0"})
            assert listening.json() == {"orders": [], "lost_hosts": []}
            orders = c.get("/admin/pool-copies", params={"pool_id": SEG["b"]}).json()["orders"]
            time.sleep(0.1)
        assert c.get("/admin/pool-copies", params={"pool_id": SEG["b"], "orders": "no"}
                     ).status_code == 400
        time.sleep(0.5)  # more rounds: the order is on its way, not made again
        later = c.get("/admin/pool-copies", params={"pool_id": SEG["b"]}).json()["orders"]
        mine_answer = c.get("/admin/pool-copies", params={"pool_id": SEG["a"]}).json()
        mine = mine_answer["orders"]
        assert mine_answer["lost_hosts"] == []  # nobody died
        stats = c.get("/admin/stats").json()["copies"]
        assert c.get("/admin/pool-copies", params={"pool_id": "x"}).status_code == 404
        metrics = c.get("/metrics").text
    assert later == [] and mine == []
    if not copies:  # negative control: off, nothing ordered
        assert orders == [] and stats["outcomes"] == {}
        return
    want = [d.hex() for d in page_digests(PREFIX, PS)]
    assert orders == [{"namespace": ns, "keys": want}]
    assert stats["pages"] == 8 and stats["waiting"] == 0
    assert stats["capacity_pages"] == 128 and stats["budget_pages"] == 32  # a quarter of it
    assert stats["held"] == 0  # the peer made no copy: nothing in b's segment
    # the copy made (b's backend publishes it as any store): the next rounds see it held
    router.state.index.index.apply(StorePages(ns, Location(PoolId(SEG["b"]), 0, Tier.POOL),
                                              None, page_keys(PREFIX, PS)))
    deadline = time.monotonic() + 5
    while router.state.copies.stats()["held"] != 1:
        assert time.monotonic() < deadline, router.state.copies.stats()
        time.sleep(0.1)
    # the rounds' own lookups count no hit: with no request, the prefix only cools down
    before = router.state.index.hot_prefixes(ns, 1, time.monotonic())[0].hit_rate
    time.sleep(1.0)  # five more rounds
    assert router.state.index.hot_prefixes(ns, 1, time.monotonic())[0].hit_rate < before
    assert 'radix_global_copy_orders_total{outcome="ordered"} 1.0' in metrics
    # rack r1 fails: its segment leaves with wa, and b's copy is the prefix's only holder,
    # no extra copy: it stops counting against the budget (a returning rack gets a copy)
    with router.client() as c:
        assert c.delete("/admin/workers/wa").status_code == 200
    deadline = time.monotonic() + 5
    while router.state.copies.stats()["pages"]:
        assert time.monotonic() < deadline, router.state.copies.stats()
        time.sleep(0.1)
    assert router.state.copies.stats()["held"] == 0


def test_the_segments_capacity_is_what_their_workers_registered() -> None:
    from radix_global.registration import WorkerInfo
    from router.cluster.domain_copies import capacity_pages

    def info(wid: str, capacity: int | None, kv: int | None = 100) -> WorkerInfo:
        return WorkerInfo(worker_id=wid, url="http://h:1", model="m", namespace="m@1",
                          page_size=PS, pool_id=SEG["a"], kv_bytes_per_token=kv,
                          pool_capacity_bytes=capacity)

    assert capacity_pages([]) is None
    assert capacity_pages([info("w1", None), info("w2", 4000, kv=None)]) is None
    assert capacity_pages([info("w1", 4000), info("w2", 8000), info("w3", None)]) == 30


def test_a_segment_worker_that_leaves_puts_its_host_on_the_lost_list(upstreams, router_factory
                                                                      ) -> None:
    """The copy-orders answer lists the host of a segment whose worker left (docs/interfaces.md,
    "Mooncake Store as the L3 pool": reads around a lost host) until a worker registers there
    again."""
    peers = {h: upstreams() for h in "ab"}
    router = router_factory(workers=(), policy="conductor")
    with router.client() as c:
        def register(h: str) -> None:
            r = c.post("/admin/workers", json={
                "worker_id": f"w{h}", "model": "tiny", "namespace": "tiny@1", "page_size": PS,
                "url": peers[h][1].url.replace("127.0.0.1", HOST[h]), "pool_id": SEG[h]})
            assert r.status_code == 201, r.text

        def lost() -> list[str]:
            return c.get("/admin/pool-copies", params={"pool_id": SEG["b"]}).json()["lost_hosts"]

        register("a")
        register("b")
        router.wait_workers(2)
        assert lost() == []
        assert c.delete("/admin/workers/wa").status_code == 200
        assert lost() == [HOST["a"]]
        register("a")
        assert lost() == []
