"""The load view's pure parts (router/routing/load_view.py): the peers' per-slot sum kept on
update equals a brute-force sum over the publications counted; own work gathered per slot."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radix_global.types import WorkerId
from router.routing.load_view import NO_LOAD, PeerLoads, SlotLoad, own_loads
from router.routing.queue_model import Slot

SLOTS = [(WorkerId(w), r) for w in ("a", "b", "c") for r in (0, 1)]
loads = st.builds(SlotLoad, *(st.integers(0, 50) for _ in range(5)), age_s=st.just(0.0))
publication = st.dictionaries(st.sampled_from(SLOTS), loads, max_size=4)
ops = st.lists(st.tuples(st.sampled_from(["update", "drop", "expire", "forget"]),
                         st.sampled_from(["r1", "r2", "r3"]), publication,
                         st.integers(0, 3)), max_size=40)


@given(ops)
def test_the_kept_sum_equals_a_brute_force_sum(steps):
    view, model, now, seq = PeerLoads(expire_s=2.0), {}, 0.0, 0
    for op, router, slots, dt in steps:
        now += dt
        if op == "update":
            seq += 1
            before = model.get(router, (now, {}))[1]
            gave = sum(max(0, x.prefilling - slots.get(s, NO_LOAD).prefilling)
                       + (x.held > 0 and slots.get(s, NO_LOAD).held == 0)
                       for s, x in before.items())
            # prefills that ended, slots no longer waited for
            assert view.update(router, seq, slots, now) == gave
            want_waiting = {s: sorted(r for r, (_, p) in model.items()
                                      if r != router and p.get(s, NO_LOAD).held > 0)
                            for s in SLOTS}
            model[router] = (now, {s: x for s, x in slots.items() if not x.empty})
            for s in SLOTS:
                if slots.get(s, NO_LOAD).held > 0:
                    want_waiting[s] = sorted([*want_waiting[s], router])
                assert sorted(view.waiting(s)) == want_waiting[s]
        elif op == "drop":
            view.drop(router)
            model.pop(router, None)
        elif op == "forget":
            view.forget_worker(WorkerId("a"))
            model = {r: (t, {s: x for s, x in p.items() if s[0] != "a"})
                     for r, (t, p) in model.items()}
        else:
            view.expire(now)
            model = {r: v for r, v in model.items() if now - v[0] <= 2.0}
        for slot in SLOTS:
            want = NO_LOAD
            for _, p in model.values():
                want = want.plus(p.get(slot, NO_LOAD))
            assert view.load(slot, now)[:5] == want[:5]
        assert view.routers() == sorted(model)


def test_an_older_publication_is_not_counted():
    view, slot = PeerLoads(1.0), SLOTS[0]
    assert view.update("r", 5, {slot: SlotLoad(requests=2)}, 0.0) == 0
    assert view.update("r", 4, {slot: SlotLoad(requests=9)}, 0.1) is None
    assert view.update("r", 5, {slot: SlotLoad(requests=9)}, 0.1) is None  # a refreshed one
    assert view.load(slot, 0.5) == SlotLoad(requests=2, age_s=0.5)
    view.refreshed("r", 0.9)
    assert view.expire(1.5) == [] and view.expire(2.0) == ["r"]
    assert view.load(slot, 2.0) == NO_LOAD


def test_negative_contributions_are_not_counted():
    view, slot = PeerLoads(1.0), SLOTS[0]
    view.update("r", 1, {slot: SlotLoad(requests=-3), SLOTS[1]: SlotLoad(held=1)}, 0.0)
    assert view.load(slot, 0.0) == NO_LOAD and view.load(SLOTS[1], 0.0).held == 1


def test_waiting_names_the_peers_holding_requests_for_a_slot():
    view, (a, b) = PeerLoads(1.0), SLOTS[:2]
    view.update("r1", 1, {a: SlotLoad(prefilling=2), b: SlotLoad(held=1)}, 0.0)
    view.update("r2", 1, {a: SlotLoad(held=3)}, 0.0)
    assert view.waiting(a) == ["r2"] and view.waiting(b) == ["r1"]
    view.drop("r2")
    assert view.waiting(a) == []


def test_own_loads_gathers_each_part_per_slot():
    a, b = SLOTS[0], SLOTS[1]
    got = own_loads({a: 3}, {a: (2, 500)}, {b: 128}, [a, a, b])
    assert got == {a: SlotLoad(3, 2, 500, 0, 2), b: SlotLoad(0, 0, 0, 128, 1)}


def test_own_loads_counts_released_requests_as_prefills_until_routed():
    a = SLOTS[0]
    assert own_loads({a: 1}, {a: (1, 100)}, {}, [], [a, a]) == {a: SlotLoad(3, 3, 100, 0, 0)}


def test_a_peer_never_sees_room_a_release_is_about_to_take():
    """Router p's prefill on a depth-1 slot ends and p's gate releases its held request to that
    slot; the request is routed a moment later, in its own coroutine. A publication of p's work
    in between must still show the slot taken, or router q, pumping on it, books it again."""
    from radix_global.types import Namespace, WorkerId
    from router.routing.contract import RouteRequest, WorkerState
    from router.routing.cost import CostModel
    from router.routing.dispatch_gate import DispatchGate, Fifo
    from router.routing.driver import PolicyDriver
    from router.routing.policies import get_policy

    ns, slot = Namespace("ns"), (WorkerId("w0"), 0)
    servers = {"m": {slot}}
    p_gate = DispatchGate(Fifo(), depth=1)
    p = PolicyDriver(get_policy("round_robin"), CostModel(), gate=p_gate)
    p_gate.hold("a", "m", 1.0, now=0.0)
    assert p_gate.release(servers, now=0.0) == ["a"]
    p.route(RouteRequest("a", ns, 10, [], 16), [WorkerState(WorkerId("w0"), ns)], now=0.0)
    p_gate.hold("b", "m", 1.0, now=0.0)
    p.on_room = lambda: p_gate.release(servers, now=1.0)  # what the dispatcher's pump does
    p.prefill_done("a", now=1.0)  # releases "b", not routed yet

    def published(with_released: bool) -> dict[Slot, SlotLoad]:
        active, prefills = p.cost.queue.slot_work()
        return own_loads(active, prefills, {}, p_gate.held_servers(),
                         p_gate.released_servers() if with_released else ())

    def q_releases(publication: dict[Slot, SlotLoad]) -> list[str]:
        q_gate = DispatchGate(Fifo(), depth=1)
        q_gate.elsewhere = lambda s: publication.get(s, NO_LOAD).prefilling  # type: ignore[arg-type]
        q_gate.hold("c", "m", 1.0, now=1.0)
        return q_gate.release(servers, now=1.0)

    assert q_releases(published(with_released=True)) == []
    assert q_releases(published(with_released=False)) == ["c"]  # the negative control
