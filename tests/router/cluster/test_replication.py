"""router/cluster/replication.py: hot-prefix warming with the real GlobalIndex."""

from __future__ import annotations

from radix_global.index import GlobalIndex
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId
from router.cluster.replication import WarmConfig, WarmupPlanner
from router.routing.contract import WorkerState

NS = Namespace("m@1")
W0, W1, W2 = WorkerId("w0"), WorkerId("w1"), WorkerId("w2")


def hot_index(prefixes: int = 1, pages: int = 8, hits: int = 50) -> tuple[GlobalIndex, list]:
    idx = GlobalIndex(half_life_s=60.0)
    idx.register_namespace(NS, 16)
    for j in range(prefixes):
        keys = [PageKey(10_000 * (j + 1) + i) for i in range(pages)]
        idx.apply(StorePages(NS, Location(W0, 0, Tier.GPU), None, keys))
        for t in range(hits):
            idx.match(NS, keys, t * 0.1)
    return idx, idx.hot_prefixes(NS, 10, 5.0)


def slots(*ids: WorkerId) -> list[WorkerState]:
    return [WorkerState(w, NS) for w in ids]


def test_hot_prefix_on_a_busy_holder_is_warmed_on_the_lightest_worker() -> None:
    idx, hot = hot_index()
    assert hot and hot[0].pages == 8
    planner = WarmupPlanner(WarmConfig(min_hit_rate=0.1))
    loads = {(W0, 0): 9, (W1, 0): 3, (W2, 0): 0}
    actions = planner.plan(NS, hot, slots(W0, W1, W2), loads, idx, 5.0)
    assert [(a.worker_id, a.keys, a.holders) for a in actions] == [(W2, hot[0].keys, 1)]
    # the same (prefix, worker) is not proposed again within the cooldown: the next lightest is
    again = planner.plan(NS, hot, slots(W0, W1, W2), loads, idx, 6.0)
    assert [a.worker_id for a in again] == [W1]
    assert planner.plan(NS, hot, slots(W0, W1, W2), loads, idx, 7.0) == []


def test_no_warming_when_a_holder_has_spare_capacity_or_prefix_is_cold() -> None:
    idx, hot = hot_index()
    planner = WarmupPlanner(WarmConfig(min_hit_rate=0.1, busy_margin=2))
    balanced = {(W0, 0): 1, (W1, 0): 0}
    assert planner.plan(NS, hot, slots(W0, W1), balanced, idx, 5.0) == []
    cold = WarmupPlanner(WarmConfig(min_hit_rate=1e6))
    assert cold.plan(NS, hot, slots(W0, W1), {(W0, 0): 9}, idx, 5.0) == []


def test_token_bucket_bounds_the_warming_rate() -> None:
    idx, hot = hot_index(prefixes=3, pages=8)
    assert len(hot) == 3
    planner = WarmupPlanner(WarmConfig(min_hit_rate=0.1, rate_pages_per_s=4.0, burst_pages=16,
                                       cooldown_s=1000.0))
    ws = slots(W0, W1)
    loads = {(W0, 0): 9, (W1, 0): 0}
    first = planner.plan(NS, hot, ws, loads, idx, 5.0)
    assert len(first) == 2 and planner.throttled == 1  # 16 pages of budget = 2 prefixes of 8
    assert planner.plan(NS, hot, ws, loads, idx, 5.5) == []  # 2 pages refilled: not enough
    later = planner.plan(NS, hot, ws, loads, idx, 7.0)  # 8 pages refilled
    assert len(later) == 1
    assert {a.keys for a in first + later} == {p.keys for p in hot}


def test_prefix_larger_than_the_bucket_is_counted_not_planned() -> None:
    idx, hot = hot_index(pages=8)
    planner = WarmupPlanner(WarmConfig(min_hit_rate=0.1, burst_pages=4))
    assert planner.plan(NS, hot, slots(W0, W1), {(W0, 0): 9}, idx, 5.0) == []
    assert planner.too_large == 1
