"""``/admin/hot``: the hottest prefixes of each model as key hashes and lengths, with how many
holders have all of each on each tier; refreshed at most every ``HOT_REFRESH_S``."""

from __future__ import annotations

from radix_global.keys import page_keys
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, Tier, WorkerId


def test_the_hottest_prefix_is_the_one_requests_hit(upstreams, router_factory, monkeypatch):
    import router.http.dashboard as dashboard

    _, server = upstreams()
    router = router_factory(workers=(server.url,), policy="conductor")
    router.wait_workers(1)
    wid = f"127.0.0.1:{server.port}"
    ids = list(range(10, 42))  # 8 pages of 4 tokens
    ns = Namespace(router.state.registry.models()["tiny"])
    keys = page_keys(ids, 4)
    router.state.index.index.apply(StorePages(ns, Location(WorkerId(wid), 0, Tier.GPU), None,
                                              keys))
    with router.client() as c:
        assert c.get("/admin/hot").json() == {"tiny": []}  # stored, never hit yet
        for i in range(3):
            assert c.post("/generate", json={"input_ids": [*ids, 50 + i]}).status_code == 200
        assert c.get("/admin/hot").json() == {"tiny": []}  # the walk is not redone at once
        monkeypatch.setattr(dashboard, "HOT_REFRESH_S", 0.0)
        hot = c.get("/admin/hot").json()["tiny"]
    assert hot and hot[0]["key"] == f"{int(keys[-1]) & (2**64 - 1):016x}", hot
    assert hot[0]["tokens"] == 32 and hot[0]["tiers"] == {"gpu": 1, "host": 1, "pool": 1}
    assert hot[0]["holders"] == 1 and hot[0]["hit_rate"] > 0
    assert "10, 11" not in str(hot)  # never the prompt itself


def test_an_embedded_index_too_large_to_walk_on_the_loop_says_so(upstreams, router_factory,
                                                                  monkeypatch):
    import router.http.dashboard as dashboard

    monkeypatch.setattr(dashboard, "HOT_WALK_MAX_NODES", 0)
    _, server = upstreams()
    router = router_factory(workers=(server.url,), policy="conductor")
    router.wait_workers(1)
    wid = f"127.0.0.1:{server.port}"
    ns = Namespace(router.state.registry.models()["tiny"])
    router.state.index.index.apply(StorePages(ns, Location(WorkerId(wid), 0, Tier.GPU), None,
                                              page_keys(list(range(8)), 4)))
    with router.client() as c:
        assert "index service" in c.get("/admin/hot").json()["unavailable"]
