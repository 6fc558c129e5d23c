"""The slot table (``router/routing/slot_table.py``): a decision from a table is the decision
from the list of the same slots, whatever happened before it. The reference is the walk over
every slot (``router/routing/shortlist.py::Shortlist.slots`` given a list); the table's
shortlist looks only at the slots that may differ from idle ones and takes the idle ones from
``IdleSlots``."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_global.index import GlobalIndex
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PageKey, PoolId, Role, Tier, WorkerId
from router.routing.contract import Decision, RouteRequest, WorkerState, prefill_candidates
from router.routing.cost import CostConfig, CostModel
from router.routing.driver import PolicyDriver
from router.routing.idle_slots import IdleSlots
from router.routing.policies import get_policy
from router.routing.policies.conductor import ConductorPolicy
from router.routing.prefill_model import PrefillModel
from router.routing.slot_table import SlotTable

NS, OTHER = Namespace("m@1"), Namespace("other@1")
PS = 16
POOL = PoolId("pool")


class _Side:
    """One router: its own index, cost model and policy, routing from a list or a table."""

    def __init__(self, prefixes: list[list[PageKey]], gpu: list[tuple[int, str]], k: int,
                 policy: str) -> None:
        self.index = GlobalIndex()
        self.index.register_namespace(NS, PS)
        for j, worker in gpu:
            self.index.apply(StorePages(NS, Location(WorkerId(worker), 0, Tier.GPU), None,
                                        prefixes[j][:8]))
        self.index.apply(StorePages(NS, Location(POOL, 0, Tier.POOL), None, prefixes[0]))
        cost = CostModel(CostConfig(drag_half_life=8.0), prefill_prior=lambda: (
            PrefillModel.calibrated(0.001, 1e-4, 1e-9)))
        options = {"price_top_k": k} if policy == "conductor" else {}
        self.driver = PolicyDriver(get_policy(policy, **options), cost, self.index)


def _states(workers: dict[str, tuple[int, bool, str | None]], loads: dict[tuple[str, int], tuple]
            ) -> list[WorkerState]:
    out = []
    for w, (dp, accepting, _) in sorted(workers.items()):
        for rank in range(dp):
            peer_requests, peer_tokens, running, waiting_tokens = loads.get((w, rank), (0,) * 4)
            out.append(WorkerState(
                WorkerId(w), OTHER if w == "x" else NS, rank, dp, Role.DECODE if w == "d" else
                Role.MIXED, POOL if int(w[1:] or 0) % 2 else None, accepting=accepting,
                peer_requests=peer_requests, peer_prefill_tokens=peer_tokens,
                running=running, waiting_tokens=waiting_tokens))
    return out


def _run(seed: int, policy: str = "conductor", k: int = 2, steps: int = 300) -> None:
    rng = random.Random(seed)
    prefixes = [[PageKey(rng.getrandbits(60)) for _ in range(12)] for _ in range(5)]
    names = [f"w{i}" for i in range(rng.randrange(3, 12))] + ["d", "x"]
    workers = {w: (rng.choice([1, 1, 2]), rng.random() > 0.15, rng.choice([None, "h1", "h2"]))
               for w in names}
    gpu = [(rng.randrange(5), rng.choice(names)) for _ in range(4)]
    walk, fast = (_Side(prefixes, gpu, k, policy) for _ in range(2))
    for side in (walk, fast):
        for w, (_, _, domain) in workers.items():
            side.driver.cost.share_compute(WorkerId(w), domain)
    loads: dict[tuple[str, int], tuple] = {}
    base = SlotTable(_states(workers, {}))
    open_: list[str] = []
    for r in range(steps):
        now = r * 0.05
        op = rng.random()
        if op < 0.35:  # a request
            keys = prefixes[rng.randrange(5)][: rng.randrange(0, 13)]
            req = RouteRequest(f"r{r}", NS, len(keys) * PS + rng.randrange(1, 40), keys, PS)
            states = _states(workers, loads)
            by_slot = {x.slot: x for x in states}
            overlay = base.with_loads(list(loads), lambda s, by_slot=by_slot: by_slot[s.slot])
            a = walk.driver.route(req, states, now)
            b = fast.driver.route(req, overlay, now)
            assert a == b, (seed, r)
            if a.accepted:
                open_.append(req.request_id)
        elif op < 0.6 and open_:  # a first token, measured (the drag and prefill fits learn)
            rid = rng.choice(open_)
            measured = rng.uniform(0.001, 0.3)
            for side in (walk, fast):
                side.driver.prefill_done(rid, now, measured)
        elif op < 0.85 and open_:
            rid = open_.pop(rng.randrange(len(open_)))
            for side in (walk, fast):
                side.driver.finished(rid, True, now)
        elif op < 0.93:  # another router's or an engine's load on a slot, or none any more
            w = rng.choice(names)
            slot = (w, rng.randrange(workers[w][0]))
            if rng.random() < 0.4:
                loads.pop(slot, None)
            else:
                loads[slot] = (rng.randrange(3), rng.choice([0, 500]), rng.choice([None, 0, 2]),
                               rng.choice([None, 0, 700]))
        elif op < 0.97:  # another router routed a prefix to a slot
            w = rng.choice(names)
            tip = prefixes[rng.randrange(5)][rng.randrange(12)]
            for side in (walk, fast):
                side.driver.policy.on_peer_routed((WorkerId(w), 0), tip, now)
        else:  # a worker drains, comes back or leaves: the table is rebuilt
            w = rng.choice(names[:-2])
            dp, accepting, domain = workers[w]
            if rng.random() < 0.3 and len(names) > 4:
                del workers[w]
                names.remove(w)
                loads = {s: v for s, v in loads.items() if s[0] != w}
                open_ = [rid for rid in open_ if rid in walk.driver._requests]
                for side in (walk, fast):
                    side.driver.worker_removed(WorkerId(w))
                    side.driver.cost.share_compute(WorkerId(w), None)
            else:
                workers[w] = (dp, not accepting, domain)
            base = SlotTable(_states(workers, {}))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_the_conductor_decides_from_a_table_as_from_the_list(seed: int) -> None:
    _run(seed)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 4]))
def test_the_shortlist_size_does_not_matter(seed: int, k: int) -> None:
    _run(seed, k=k, steps=80)


@pytest.mark.parametrize("policy", ["round_robin", "least_load", "approx_cache", "random"])
def test_every_policy_decides_from_a_table_as_from_the_list(policy: str) -> None:
    for seed in range(5):
        _run(seed, policy, steps=80)


def test_a_table_lists_each_namespaces_prefill_candidates_in_slot_order() -> None:
    states = [WorkerState(WorkerId("b"), NS, 1, 2), WorkerState(WorkerId("a"), NS),
              WorkerState(WorkerId("b"), NS, 0, 2),
              WorkerState(WorkerId("c"), NS, role=Role.DECODE),
              WorkerState(WorkerId("e"), NS, accepting=False), WorkerState(WorkerId("d"), OTHER)]
    table = SlotTable(states)
    req = RouteRequest("r", NS, 10, [], PS)
    assert list(prefill_candidates(req, table)) == prefill_candidates(req, states)
    assert [s.slot for s in table] == sorted(s.slot for s in states)
    assert table.position(NS, (WorkerId("b"), 1)) == 2 and table.position(NS, ("c", 0)) is None
    loaded = table.with_loads([("a", 0), ("zz", 0)], lambda s: s._replace(peer_requests=3))
    assert loaded.get(("a", 0)).peer_requests == 3  # type: ignore[union-attr]
    assert prefill_candidates(req, loaded)[0].peer_requests == 3
    assert table.get(("a", 0)).peer_requests == 0  # type: ignore[union-attr]
    assert set(loaded.loaded()) == {("a", 0)} and loaded.get(("zz", 0)) is None
    with pytest.raises(ValueError, match="once"):
        SlotTable(states + states[:1])


def test_idle_slots_take_the_cheapest_first_and_equal_ones_in_rotation() -> None:
    idle = IdleSlots([0.0, 0.5, 0.0, 0.0, 0.2])
    assert idle.first(3, 0, ()) == [0, 2, 3]
    assert idle.first(3, 3, ()) == [3, 0, 2]  # the zero ones from position 3, wrapping
    assert idle.first(5, 3, {0}) == [3, 2, 4, 1]
    idle.update(1, 0.0)
    idle.update(0, 0.3)
    assert idle.first(5, 2, ()) == [2, 3, 1, 4, 0]


def test_a_brute_force_order_agrees_with_idle_slots() -> None:
    rng = random.Random(7)
    for _ in range(200):
        costs = [rng.choice([0.0, 0.1, 0.2]) for _ in range(rng.randrange(1, 12))]
        idle = IdleSlots(costs)
        for _ in range(3):
            p = rng.randrange(len(costs))
            costs[p] = rng.choice([0.0, 0.1, 0.2])
            idle.update(p, costs[p])
        n, turn, k = len(costs), rng.randrange(50), rng.randrange(1, 6)
        skip = {rng.randrange(n) for _ in range(2)}
        brute = sorted((i for i in range(n) if i not in skip),
                       key=lambda i: (costs[i], (i - turn) % n))[:k]
        assert idle.first(k, turn, skip) == brute


def test_the_conductor_prices_only_the_busy_and_holding_slots_of_a_big_table() -> None:
    """The point of the table: among 500 idle slots and one holder, a decision prices the
    holder and ``k`` idle ones, and visits no other slot."""
    index = GlobalIndex()
    index.register_namespace(NS, PS)
    keys = [PageKey(9000 + i) for i in range(8)]
    index.apply(StorePages(NS, Location(WorkerId("w0250"), 0, Tier.GPU), None, keys))

    class Counted(CostModel):
        calls = 0

        def queue_s(self, worker: WorkerState, now: float) -> float:
            Counted.calls += 1
            return super().queue_s(worker, now)

    driver = PolicyDriver(ConductorPolicy(price_top_k=3), Counted(), index)
    states = [WorkerState(WorkerId(f"w{i:04d}"), NS) for i in range(500)]
    req = RouteRequest("r0", NS, 8 * PS + 3, keys, PS)
    d = driver.route(req, SlotTable(states), 0.0)
    assert d.worker_id == "w0250" and len(d.candidates) == 4
    assert Counted.calls <= 5  # the holder's queue, then the priced four's (not 500)
    Counted.calls = 0
    driver.route(req._replace(request_id="r1"), states, 0.0)
    assert Counted.calls >= 500  # the list is walked (the reference)


def test_idle_changes_list_the_workers_whose_idle_queue_moved_and_flag_a_removal() -> None:
    cost = CostModel(CostConfig(drag_half_life=8.0))
    count, changed = cost.idle_changes(0)
    assert (count, changed) == (0, [])
    slot = (WorkerId("w1"), 0)
    for i in range(12):  # enough measured first tokens for the drag fit to count, late ones
        req = RouteRequest(f"r{i}", NS, 100, [], PS)
        cost.on_routed(req, Decision(f"r{i}", "t", True, slot[0], predicted_prefill_s=0.1), 0.0)
        cost.on_prefill_done(f"r{i}", 1.0, 0.1)
        cost.on_finished(f"r{i}", 1.0)
    assert cost.idle_queue_s(WorkerId("w1")) > 0  # its drag base: a cost even when idle
    now, changed = cost.idle_changes(count)
    assert changed == ["w1"] and now > count
    assert cost.idle_changes(now) == (now, [])
    cost.on_worker_removed(WorkerId("w1"))
    later, changed = cost.idle_changes(now)
    assert changed is None and later > now  # read every worker again
    assert cost.idle_queue_s(WorkerId("w1")) == 0.0
