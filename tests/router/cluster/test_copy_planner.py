"""router/cluster/copy_planner.py: which hot prefixes get a copy in another fault domain, where,
and within what budget (docs/interfaces.md, "Where hosts are", "Copies across fault domains")."""

from __future__ import annotations

from radix_global.ops import HotPrefix
from radix_global.types import HolderId, Namespace, PageKey, PoolId, WorkerId
from router.cluster.copy_planner import Copy, CopyConfig, CopyOutcome, CopyPlanner, Target

NS = Namespace("m@1")
SEG = {h: PoolId(f"mooncake-m-1@10.0.0.{i}:1") for i, h in enumerate("abcd", start=2)}
DOMAIN = {SEG["a"]: "r1", SEG["b"]: "r1", SEG["c"]: "r2", SEG["d"]: "r3"}
TARGETS = [Target(WorkerId(f"w{h}"), SEG[h], DOMAIN[SEG[h]]) for h in "abcd"]


def hot(n: int, pages: int = 4, rate: float = 1.0) -> HotPrefix:
    return HotPrefix(tuple(PageKey(100 * n + i) for i in range(pages)), pages, rate, 1)


def plan(planner: CopyPlanner, prefixes: list[HotPrefix], held: dict[int, list[HolderId]],
         now: float = 0.0, targets: list[Target] = TARGETS, known: bool = True,
         capacity_pages: int | None = None):
    return planner.plan(NS, now, prefixes, lambda keys: held.get(int(keys[-1]) // 100, []),
                        lambda h: DOMAIN.get(PoolId(h)), targets, lambda keys: known,
                        capacity_pages)


def test_a_prefix_in_one_rack_gets_a_copy_in_another_and_only_once() -> None:
    planner = CopyPlanner(CopyConfig(interval_s=1))
    orders, outcomes = plan(planner, [hot(1)], {1: [SEG["a"]]})
    assert [o.target.worker_id for o in orders] == ["wc"]  # r2: fewest pages, then by id
    assert outcomes == {CopyOutcome.ORDERED: 1}
    again, _ = plan(planner, [hot(1)], {1: [SEG["a"]]}, now=5.0)  # on its way: not again
    assert again == [] and planner.pages() == 4
    # a second hot prefix goes to the least loaded other domain
    orders, _ = plan(planner, [hot(2)], {2: [SEG["a"]]})
    assert [o.target.worker_id for o in orders] == ["wd"]


def test_a_copy_goes_near_the_prefixs_users() -> None:
    """Held in a's segment (r1); wd (r3) serves it from its own cache: the copy goes to r3
    although wc (r2) has fewer copy pages; within the users' domains, to the least loaded; a
    holder that is no target worker (a host's shm pool) says nothing; no user: the least
    loaded."""
    def target(held: list[HolderId], load_d: int = 0) -> str:
        planner = CopyPlanner(CopyConfig(interval_s=1))
        if load_d:
            planner.copies[(NS, PageKey(0), SEG["d"])] = Copy(NS, (PageKey(0),) * load_d,
                                                              SEG["d"], 0.0)
        orders, _ = planner.plan(NS, 0.0, [hot(1)], lambda keys: held,
                                 lambda h: DOMAIN.get(PoolId(h)), TARGETS, lambda keys: True)
        return orders[0].target.worker_id

    assert target([SEG["a"], WorkerId("wd")]) == "wd"
    assert target([SEG["a"], WorkerId("wd")], load_d=8) == "wd"  # still the users' domain
    assert target([SEG["a"], PoolId("shm-d")]) == "wc"
    assert target([SEG["a"]]) == "wc"


def test_prefixes_already_in_enough_domains_cold_short_or_off_segments_get_none() -> None:
    planner = CopyPlanner(CopyConfig(interval_s=1, min_pages=3, min_hit_rate=0.5))
    held = {1: [SEG["a"], SEG["c"]], 2: [SEG["a"]], 3: [SEG["a"]], 4: [PoolId("shm-h")],
            5: [PoolId(f"{SEG['a']}+disk")]}
    orders, outcomes = plan(planner, [hot(1), hot(2, pages=2), hot(3, rate=0.1), hot(4),
                                      hot(5)], held)
    assert orders == [] and not outcomes
    three = CopyPlanner(CopyConfig(interval_s=1, domains=3))
    orders, _ = plan(three, [hot(1)], held)
    assert [o.target.worker_id for o in orders] == ["wd"]  # r1, r2 held: r3


def test_no_target_no_tokens_and_the_budget_are_counted() -> None:
    planner = CopyPlanner(CopyConfig(interval_s=1, max_pages=6))
    in_r1 = [t for t in TARGETS if t.domain == "r1"]
    _, outcomes = plan(planner, [hot(1)], {1: [SEG["a"]]}, targets=in_r1)
    assert outcomes == {CopyOutcome.NO_TARGET: 1}
    _, outcomes = plan(planner, [hot(1)], {1: [SEG["a"]]}, known=False)
    assert outcomes == {CopyOutcome.NO_TOKENS: 1}
    orders, outcomes = plan(planner, [hot(1), hot(2)], {1: [SEG["a"]], 2: [SEG["a"]]})
    assert len(orders) == 1 and outcomes == {CopyOutcome.ORDERED: 1, CopyOutcome.OVER_BUDGET: 1}


def test_copies_gone_after_the_grace_period_free_the_budget() -> None:
    planner = CopyPlanner(CopyConfig(interval_s=1, max_pages=4))
    plan(planner, [hot(1)], {1: [SEG["a"]]})
    planner.forget_gone(lambda c: False, now=30.0)  # young: kept
    assert planner.pages() == 4
    planner.forget_gone(lambda c: c.target == SEG["c"], now=100.0)  # held: kept
    assert planner.pages() == 4
    planner.forget_gone(lambda c: False, now=100.0)  # gone: the budget is free again
    assert planner.pages() == 0 and planner.copies == {}
    orders, _ = plan(planner, [hot(2)], {2: [SEG["a"]]}, now=100.0)
    assert len(orders) == 1 and isinstance(next(iter(planner.copies.values())), Copy)


def test_the_budget_is_also_a_share_of_the_segments_capacity() -> None:
    planner = CopyPlanner(CopyConfig(interval_s=1, max_pages=100, max_share=0.25))
    assert planner.limit(None) == 100  # capacity not known: the page bound alone
    assert planner.limit(1000) == 100 and planner.limit(20) == 5
    held = {1: [SEG["a"]], 2: [SEG["a"]]}
    orders, outcomes = plan(planner, [hot(1), hot(2)], held, capacity_pages=32)  # 8 pages
    assert len(orders) == 2 and outcomes == {CopyOutcome.ORDERED: 2}
    planner = CopyPlanner(CopyConfig(interval_s=1, max_pages=100, max_share=0.25))
    orders, outcomes = plan(planner, [hot(1), hot(2)], held, capacity_pages=28)  # 7 pages
    assert len(orders) == 1 and outcomes[CopyOutcome.OVER_BUDGET] == 1


def test_a_copy_whose_original_left_is_promoted_and_frees_the_budget() -> None:
    """Rack r1 (a's segment, the original) failed: a's worker left, and c's copy is the
    original now. It stops counting, and the budget goes to a new copy in another domain (wa:
    r1's worker is back, the least loaded then by id). While a was registered, nothing was
    promoted and that copy was over the budget (the control); a copy not made is not promoted."""
    planner = CopyPlanner(CopyConfig(interval_s=1, max_pages=4))
    plan(planner, [hot(1)], {1: [SEG["a"]]})
    (copy,) = planner.copies.values()
    assert copy.target == SEG["c"] and copy.sources == (SEG["a"],)
    after = {1: [SEG["c"]]}  # a's segment left the index

    def made(c: Copy) -> bool:
        return c.target == SEG["c"]

    planner.settle(lambda c: False, lambda h: False, now=10.0)  # not made: kept, counted
    planner.settle(made, lambda h: h == SEG["a"], now=10.0)  # a still registered
    assert planner.pages() == 4
    _, outcomes = plan(planner, [hot(1)], after, now=10.0)
    assert outcomes == {CopyOutcome.OVER_BUDGET: 1}
    planner.settle(made, lambda h: False, now=11.0)  # a's worker left
    assert planner.pages() == 0
    orders, _ = plan(planner, [hot(1)], after, now=11.0)
    assert [o.target.worker_id for o in orders] == ["wa"]


def test_one_loss_promotes_one_copy() -> None:
    """Three domains: copies in c (r2) and d (r3) of a's prefix; a's worker leaves. The older
    copy is promoted and becomes the other's source, which keeps counting, round after round."""
    planner = CopyPlanner(CopyConfig(interval_s=1, domains=3))
    plan(planner, [hot(1)], {1: [SEG["a"]]})
    plan(planner, [hot(1)], {1: [SEG["a"], SEG["c"]]}, now=1.0)
    assert sorted(c.target for c in planner.copies.values()) == [SEG["c"], SEG["d"]]
    alive = {SEG["c"], SEG["d"]}
    for now in (10.0, 11.0, 12.0):
        planner.settle(lambda c: True, alive.__contains__, now=now)
        (left,) = planner.copies.values()
        assert left.target == SEG["d"] and left.sources == (SEG["c"],)
