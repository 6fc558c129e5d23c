"""The dispatch gate (router/routing/dispatch_gate.py): how many go, which go first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.routing.dispatch_gate import (
    DispatchConfig,
    DispatchGate,
    DispatchOrder,
    Fifo,
    Held,
    HighestRatio,
    ShortestFirst,
    fair_share,
)

SERVERS = {"m": {"s0", "s1"}}


def test_depth_per_server_bounds_what_is_released():
    gate = DispatchGate(Fifo(), depth=2)
    for i in range(6):
        gate.hold(f"r{i}", "m", 1.0, now=0.0)
    assert gate.release(SERVERS, now=0.0) == ["r0", "r1", "r2", "r3"]
    # released but not placed yet: they hold the room
    assert gate.release(SERVERS, now=0.0) == []
    for rid, server in (("r0", "s0"), ("r1", "s0"), ("r2", "s1"), ("r3", "s1")):
        gate.placed(rid, server)
    assert gate.release(SERVERS, now=0.0) == []
    assert gate.first_token("r2") is True
    assert gate.release(SERVERS, now=0.0) == ["r4"]
    assert gate.held() == 1 and gate.in_flight("s1") == 1


def test_other_routers_prefills_take_room_on_a_server():
    gate, busy = DispatchGate(Fifo(), depth=2), {"s0": 2, "s1": 1}
    gate.elsewhere = lambda server: busy.get(server, 0)  # type: ignore[arg-type]
    for i in range(3):
        gate.hold(f"r{i}", "m", 1.0, now=0.0)
    assert not gate.has_room("m", {"s0"})
    assert gate.release(SERVERS, now=0.0) == ["r0"]  # one free place, on s1
    busy.clear()  # their first tokens came back
    assert gate.release(SERVERS, now=0.0) == ["r1", "r2"]


@given(st.integers(1, 8), st.integers(1, 5), st.integers(0, 2**32), st.integers(0, 10**6))
def test_fair_shares_add_up_to_the_depth_and_the_remainder_rotates(depth, n, key, turn):
    routers = [f"r{i}" for i in range(n)]

    def shares(t: int) -> list[int]:
        return [fair_share(depth, me, [r for r in routers if r != me], key, t) for me in routers]

    assert sum(shares(turn)) == depth
    assert all(depth // n <= x <= depth // n + 1 for x in shares(turn))
    if depth < n:  # fewer places than routers: each has one within n turns
        assert all(any(shares(turn + t)[i] for t in range(n)) for i in range(n))
    assert fair_share(depth, "r0", [], key, turn) == depth  # alone: all of it
    assert fair_share(depth, "r0", routers, key, turn) == shares(turn)[0]  # itself: no matter


def test_routers_freed_at_once_book_the_depth_once_between_them():
    """Two routers' requests on a depth-2 server end together, each router holds more and sees
    the other's requests end (the shared view): with shares each books its own half; without,
    each books the whole depth, twice the server's (the negative control)."""
    def booked(shared: bool) -> int:
        gates = {me: DispatchGate(Fifo(), depth=2) for me in ("p", "q")}
        for me, gate in gates.items():
            gate.elsewhere = lambda s: 0  # the other's first tokens were published
            if shared:  # each sees the other waiting for the server (its held requests)
                gate.share = lambda s, here, me=me: fair_share(
                    2, me, ["q" if me == "p" else "p"], key=7, turn=0) if here else 0
            for i in range(3):
                gate.hold(f"{me}{i}", "m", 1.0, now=0.0, server="s0")
        return sum(len(g.release({"m": {"s0"}}, now=0.0)) for g in gates.values())

    assert booked(shared=True) == 2
    assert booked(shared=False) == 4


def test_shortest_first_and_the_overdue_go_first():
    gate = DispatchGate(ShortestFirst(max_hold_s=5.0), depth=1)
    gate.hold("long", "m", 3.0, now=0.0)
    gate.hold("short", "m", 0.2, now=1.0)
    gate.hold("mid", "m", 1.0, now=2.0)
    one = {"m": {"s0"}}
    assert gate.release(one, now=3.0) == ["short"]
    gate.drop("short")
    assert gate.release(one, now=3.0) == ["mid"]
    gate.drop("mid")
    gate.hold("tiny", "m", 0.1, now=4.0)
    # "long" has been held 5 s: it goes before the cheaper one
    assert gate.release(one, now=5.0) == ["long"]


def test_released_only_to_room_on_the_server_its_policy_would_place_it_on():
    """s1 has room, s0 none: the cheapest request, which would go to s0, waits for s0; the next
    one, placed on s1 (or anywhere), goes."""
    gate = DispatchGate(ShortestFirst(max_hold_s=30.0), depth=1)
    gate.hold("busy", "m", 1.0, now=0.0, server="s0")
    assert gate.release({"m": {"s0", "s1"}}, now=0.0) == ["busy"]
    gate.placed("busy", "s0")
    gate.hold("to-s0", "m", 0.1, now=0.0, server="s0")
    gate.hold("to-s1", "m", 0.5, now=0.0, server="s1")
    gate.hold("any", "m", 0.2, now=0.0)
    assert gate.release({"m": {"s0", "s1"}}, now=0.0) == ["any"]  # to s1, the only room
    assert gate.release({"m": {"s0", "s1"}}, now=0.0) == []  # "any" holds s1 until placed
    gate.placed("any", "s1")
    gate.first_token("busy")
    assert gate.release({"m": {"s0", "s1"}}, now=0.0) == ["to-s0"]
    gate.reprice("to-s1", 0.5, server="s0")  # priced again: the policy moved it
    gate.placed("to-s0", "s0")
    gate.first_token("any")
    assert gate.release({"m": {"s0", "s1"}}, now=0.0) == []  # s0 full, it now wants s0
    assert gate.held_ids("m") == ["to-s1"]


def test_fifo_keeps_arrival_order():
    gate = DispatchGate(Fifo(), depth=1)
    for rid, cost in (("a", 5.0), ("b", 0.1), ("c", 1.0)):
        gate.hold(rid, "m", cost, now=0.0)
    order = []
    for _ in range(3):
        (rid,) = gate.release({"m": {"s0"}}, now=0.0)
        order.append(rid)
        gate.placed(rid, "s0")
        gate.first_token(rid)
    assert order == ["a", "b", "c"]


def test_a_group_is_released_only_by_its_own_servers():
    gate = DispatchGate(Fifo(), depth=1)
    gate.hold("a1", "alpha", 1.0, now=0.0)
    gate.hold("b1", "beta", 1.0, now=0.0)
    gate.hold("b2", "beta", 1.0, now=0.0)
    assert sorted(gate.release({"alpha": {"sa"}, "beta": {"sb"}}, now=0.0)) == ["a1", "b1"]
    gate.placed("a1", "sa")
    gate.placed("b1", "sb")
    gate.first_token("a1")  # alpha's room does not release beta's request
    assert gate.release({"alpha": {"sa"}, "beta": {"sb"}}, now=0.0) == []


def test_a_group_without_servers_releases_everything():
    gate = DispatchGate(Fifo(), depth=1)
    gate.hold("a", "m", 1.0, now=0.0)
    gate.hold("b", "m", 1.0, now=0.0)
    assert gate.release({}, now=0.0) == ["a", "b"]


def test_drop_is_idempotent_and_frees_room_only_once():
    gate = DispatchGate(Fifo(), depth=1)
    gate.hold("a", "m", 1.0, now=0.0)
    assert gate.drop("a") is False  # held, never released: no room was taken
    gate.hold("b", "m", 1.0, now=0.0)
    assert gate.release({"m": {"s0"}}, now=0.0) == ["b"]
    assert gate.drop("b") is True  # released, not placed
    gate.hold("c", "m", 1.0, now=0.0)
    gate.release({"m": {"s0"}}, now=0.0)
    gate.placed("c", "s0")
    assert gate.drop("c") is True
    assert gate.drop("c") is False
    assert gate.in_flight("s0") == 0
    gate.placed("never-held", "s0")  # ignored: it never went through the gate
    assert gate.in_flight("s0") == 0



def test_a_retry_after_a_refused_connection_counts_where_it_went():
    """The relay ends the refused attempt (``drop``) and routes the request again
    (``placed``): the engine the retry went to has its prefill to do."""
    gate = DispatchGate(Fifo(), depth=2)
    gate.hold("r", "m", 1.0, 0.0, server="s0")
    assert gate.release({"m": {"s0", "s1"}}, 0.1) == ["r"]
    gate.placed("r", "s0")
    assert gate.drop("r") is True and gate.in_flight("s0") == 0
    gate.placed("r", "s1")
    assert gate.in_flight("s1") == 1
    assert gate.first_token("r") is True and gate.in_flight("s1") == 0
    gate.placed("never-held", "s1")  # ids the gate never released stay uncounted
    assert gate.in_flight("s1") == 0

def test_a_request_is_at_the_gate_once():
    gate = DispatchGate(Fifo(), depth=1)
    gate.hold("a", "m", 1.0, now=0.0)
    with pytest.raises(ValueError, match="already"):
        gate.hold("a", "m", 1.0, now=0.0)


@pytest.mark.parametrize("kw", [{"order": "lifo"}, {"depth": 0}, {"max_hold_s": 0.0},
                                {"timeout_s": -1.0}])
def test_bad_config_is_refused(kw):
    with pytest.raises(ValueError):
        DispatchConfig(**kw)


def test_off_means_no_gate():
    assert DispatchConfig("off").gate() is None
    assert isinstance(DispatchConfig().gate().order, HighestRatio)  # type: ignore[union-attr]
    gate = DispatchConfig("shortest_first", depth=3, max_hold_s=2.0).gate()
    assert gate is not None and gate.depth == 3 and isinstance(gate.order, ShortestFirst)


# Ops: hold a new request, release, place a released one, first token / drop of one.
_op = st.tuples(st.sampled_from(["hold", "release", "place", "first", "drop"]),
                st.integers(0, 50), st.floats(0.0, 5.0), st.integers(0, 2))


@settings(max_examples=500, deadline=None)
@given(st.lists(_op, max_size=80), st.integers(1, 3))
def test_released_and_unfinished_never_exceed_the_room(ops, depth):
    """Whatever the order of events, no server holds more than ``depth`` gated requests without
    a first token, and a group's released-not-done never exceeds its servers' room (requests
    placed where their policy said, as the router does right after the release)."""
    servers = ["s0", "s1", "s2"]
    gate = DispatchGate(ShortestFirst(max_hold_s=2.0), depth)
    held, unplaced, placed = set(), set(), {}
    where: dict[str, str] = {}
    t, n = 0.0, 0
    for op, k, cost, s in ops:
        t += 0.1
        if op == "hold":
            n += 1
            where[f"r{n}"] = servers[s]
            gate.hold(f"r{n}", "m", cost, t, server=servers[s])
            held.add(f"r{n}")
        elif op == "release":
            out = gate.release({"m": set(servers)}, t)
            assert set(out) <= held
            held -= set(out)
            unplaced |= set(out)
        elif op == "place" and unplaced:
            rid = sorted(unplaced)[k % len(unplaced)]
            gate.placed(rid, where[rid])
            unplaced.discard(rid)
            placed[rid] = where[rid]
        elif op == "first" and placed:
            rid = sorted(placed)[k % len(placed)]
            assert gate.first_token(rid) is True
            del placed[rid]
        elif op == "drop":
            pool = sorted(held | unplaced | set(placed))
            if pool:
                rid = pool[k % len(pool)]
                assert gate.drop(rid) is (rid in unplaced or rid in placed)
                held.discard(rid)
                unplaced.discard(rid)
                placed.pop(rid, None)
        assert gate.held() == len(held)
        assert all(gate.in_flight(x) + sum(1 for r in unplaced if where[r] == x) <= depth
                   for x in servers)
        assert len(placed) + len(unplaced) <= depth * len(servers)


def test_wait_is_the_work_held_ahead_shared_by_the_servers():
    gate = DispatchGate(ShortestFirst(max_hold_s=5.0), depth=1)
    assert gate.wait_s("m", 1.0, servers=2, now=0.0) == 0.0  # nothing held
    gate.hold("short", "m", 0.5, now=0.0)
    gate.hold("long", "m", 3.0, now=0.0)
    gate.hold("other-model", "x", 9.0, now=0.0)
    assert gate.wait_s("m", 1.0, servers=2, now=1.0) == pytest.approx(0.25)  # only "short"
    assert gate.wait_s("m", 4.0, servers=2, now=1.0) == pytest.approx(1.75)
    assert gate.wait_s("m", 1.0, servers=2, now=5.0) == pytest.approx(1.75)  # "long" overdue
    fifo = DispatchGate(Fifo(), depth=1)
    fifo.hold("long", "m", 3.0, now=0.0)
    assert fifo.wait_s("m", 0.1, servers=1, now=0.0) == pytest.approx(3.0)


def test_reprice_changes_the_order_and_room_counts_what_release_would_send():
    gate = DispatchGate(ShortestFirst(max_hold_s=30.0), depth=1)
    gate.hold("a", "m", 1.0, now=0.0)
    gate.hold("b", "m", 2.0, now=0.0)
    assert gate.has_room("m", {"s0"}) and gate.has_room("m", ())
    assert gate.groups() == {"m"}
    gate.reprice("b", 0.5)
    assert gate.release({"m": {"s0"}}, now=0.0) == ["b"]
    assert not gate.has_room("m", {"s0"})  # "b" released, not yet placed
    gate.reprice("b", 9.0)  # no longer held: ignored
    assert gate.held_ids("m") == ["a"]


def test_the_driver_tells_the_gate_where_a_request_went_and_when_it_made_room():
    from radix_global.types import Namespace, WorkerId
    from router.routing.contract import RouteRequest, WorkerState
    from router.routing.cost import CostModel
    from router.routing.driver import PolicyDriver
    from router.routing.policies import get_policy

    ns = Namespace("ns")
    workers = [WorkerState(WorkerId("w0"), ns)]
    gate = DispatchGate(Fifo(), depth=1)
    driver = PolicyDriver(get_policy("round_robin"), CostModel(), gate=gate)
    rooms: list[int] = []
    driver.on_room = lambda: rooms.append(gate.in_flight(("w0", 0)))
    for rid in ("a", "b"):
        gate.hold(rid, "m", 1.0, now=0.0)
    (first,) = gate.release({"m": {("w0", 0)}}, now=0.0)
    driver.route(RouteRequest(first, ns, 10, [], 16), workers, now=0.0)
    assert gate.in_flight(("w0", 0)) == 1
    driver.prefill_done(first, now=1.0)
    assert rooms == [0]
    driver.finished(first, True, now=2.0)  # already counted out at its first token
    assert rooms == [0]
    (second,) = gate.release({"m": {("w0", 0)}}, now=2.0)
    driver.route(RouteRequest(second, ns, 10, [], 16), workers, now=2.0)
    driver.finished(second, False, now=3.0)  # failed before its first token
    assert rooms == [0, 0] and gate.in_flight(("w0", 0)) == 0


def test_a_released_request_is_routed_to_the_server_it_was_released_to():
    """The gate released it to w1's room; the policy, asked again at routing, would pick w0
    (round robin's turn), where there is none: it goes to w1."""
    from radix_global.types import Namespace, WorkerId
    from router.routing.contract import RouteRequest, WorkerState
    from router.routing.cost import CostModel
    from router.routing.driver import PolicyDriver
    from router.routing.policies import get_policy

    ns = Namespace("ns")
    workers = [WorkerState(WorkerId("w0"), ns), WorkerState(WorkerId("w1"), ns)]
    gate = DispatchGate(Fifo(), depth=1)
    driver = PolicyDriver(get_policy("round_robin"), CostModel(), gate=gate)
    gate.hold("r", "m", 1.0, now=0.0, server=("w1", 0))
    assert gate.release({"m": {("w0", 0), ("w1", 0)}}, now=0.0) == ["r"]
    assert gate.released_to("r") == ("w1", 0)
    # not released by the gate: the policy's own picks, w0 then w1; w0's turn next
    assert [driver.route(RouteRequest(rid, ns, 10, [], 16), workers, now=0.0).slot
            for rid in ("s", "t")] == [("w0", 0), ("w1", 0)]
    assert driver.route(RouteRequest("r", ns, 10, [], 16), workers, now=0.0).slot == ("w1", 0)
    assert gate.released_to("r") is None and gate.in_flight(("w1", 0)) == 1
    # released to w1, which began draining meanwhile: routed where it can go, not refused
    gate.hold("d", "m", 1.0, now=1.0, server=("w1", 0))
    gate.first_token("r")
    assert gate.release({"m": {("w1", 0)}}, now=1.0) == ["d"]
    draining = [workers[0], workers[1]._replace(accepting=False)]
    assert driver.route(RouteRequest("d", ns, 10, [], 16), draining, now=1.0).slot == ("w0", 0)


def test_highest_ratio_favours_short_work_and_ages_long_work_by_its_size():
    order = HighestRatio()
    long_ = Held("long", "m", arrived=0.0, cost_s=2.0, seq=1)
    short = Held("short", "m", arrived=1.0, cost_s=0.1, seq=2)
    # at 1.0 s: long (1 + 2) / 2 = 1.5, short fresh = 1.0; at 1.1 s short is 2.0
    assert order.next([long_, short], now=1.0) is long_
    assert order.next([long_, short], now=1.1) is short
    cached = Held("cached", "m", arrived=1.0, cost_s=0.0, seq=3)  # counted as 10 ms of work
    assert order.next([long_, short, cached], now=1.01) is cached
    assert order.ahead([long_, short], cost_s=0.5, now=2.0) == [long_, short]
    assert order.ahead([long_, short], cost_s=0.5, now=1.05) == [short]
    fresh = [Held(f"r{i}", "m", arrived=1.0, cost_s=1.0, seq=i) for i in range(4)]
    assert order.ahead(fresh, cost_s=1.0, now=1.0) == fresh  # a burst of equals: FIFO


def _long_prompt_released_at(order: DispatchOrder, timeout_s: float) -> float | None:
    """A simulated engine (one server, depth 1, 0.1 s per request to its first token) busy
    with a request at t=0, a long prompt (predicted 100 s of work) held at once, and short
    prompts (predicted 10 ms) arriving 10 per second, each 20 ms before the engine has room: a
    short one has always waited a little when room comes, which gives it a ratio of 3. When the
    long prompt is released, or None if it is still held at ``timeout_s``."""
    gate, one = DispatchGate(order, depth=1), {"m": {"s0"}}
    gate.hold("busy", "m", 0.1, now=0.0, server="s0")
    assert gate.release(one, now=0.0) == ["busy"]
    gate.placed("busy", "s0")
    gate.hold("long", "m", 100.0, now=0.0, server="s0")
    first_token: dict[int, str] = {100: "busy"}  # ms -> request id
    for ms in range(1, round(timeout_s * 1000)):
        now = ms / 1000
        if ms % 100 == 80:
            gate.hold(f"s{ms}", "m", 0.01, now=now, server="s0")
        if ms in first_token:
            gate.first_token(first_token.pop(ms))
        for rid in gate.release(one, now=now):
            if rid == "long":
                return now
            gate.placed(rid, "s0")
            first_token[ms + 100] = rid
    return None


def test_ageing_sends_a_long_prompt_before_its_timeout_under_a_stream_of_short_ones():
    """Issue 35, item 6: the default order alone (highest response ratio) keeps a long prompt
    held for as long as short ones keep arriving; held half of its timeout it goes first."""
    config = DispatchConfig()  # the router's defaults: highest_ratio, 60 s
    assert config.order == HighestRatio.name and config.overdue_s == config.timeout_s / 2
    gate = config.gate()
    assert gate is not None
    released = _long_prompt_released_at(gate.order, config.timeout_s)
    assert released is not None and config.overdue_s <= released < config.overdue_s + 0.2
    # negative control: the ratio without the bound starves it up to its timeout
    assert _long_prompt_released_at(HighestRatio(), config.timeout_s) is None


@pytest.mark.parametrize("name", ["fifo", "shortest_first", "highest_ratio"])
def test_every_order_sends_the_overdue_first_oldest_first(name):
    config = DispatchConfig(name, depth=1, max_hold_s=100.0, timeout_s=10.0)
    gate = config.gate()
    assert gate is not None
    gate.hold("old-long", "m", 50.0, now=0.0)
    gate.hold("young-long", "m", 40.0, now=1.0)
    gate.hold("fresh-short", "m", 0.01, now=5.9)
    # held 6 s (over 10 / 2) and 5 s: both overdue, the older first, both before the short one
    assert gate.order.next(list(gate._held.values()), now=6.0).request_id == "old-long"
    assert [h.request_id for h in gate.order.ahead(list(gate._held.values()), 100.0, now=6.0)
            ] == ["old-long", "young-long", "fresh-short"]
    assert gate.release({"m": {"s0"}}, now=6.0) == ["old-long"]


def test_a_pump_sorts_once_a_long_held_queue_whose_server_is_busy():
    """s0 is busy and all 3,000 held requests would go to it; s1 has room. The release looks
    at each once (it used to pick the next by scanning all the rest, per request: 4.5M
    ratio evaluations here)."""
    gate = DispatchGate(HighestRatio(), depth=1)
    gate.hold("busy", "m", 1.0, now=0.0, server="s0")
    assert gate.release({"m": {"s0"}}, now=0.0) == ["busy"]
    gate.placed("busy", "s0")
    for i in range(3000):
        gate.hold(f"r{i}", "m", 1.0 + i % 7, now=0.0, server="s0")
    calls = 0
    ratio = gate.order._ratio  # type: ignore[attr-defined]

    def counted(h: Held, now: float) -> float:
        nonlocal calls
        calls += 1
        return ratio(h, now)

    gate.order._ratio = counted  # type: ignore[attr-defined]
    assert gate.release({"m": {"s0", "s1"}}, now=1.0) == []  # nothing may go to s1 ...
    assert calls <= 3000  # ... and finding that out priced each once
    gate.hold("anywhere", "m", 0.5, now=1.0)
    assert gate.release({"m": {"s0", "s1"}}, now=1.0) == ["anywhere"]
