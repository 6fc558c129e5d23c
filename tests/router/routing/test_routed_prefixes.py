"""router/routing/routed_prefixes.py, and the conductor counting a just-routed prompt as held."""

from __future__ import annotations

import pytest
from test_conductor import KEYS, NS, PS, driver, index_with, workers

from radix_global.types import PageKey, WorkerId
from router.routing.contract import RouteRequest
from router.routing.routed_prefixes import RoutedPrefixes

SLOT = (WorkerId("w0"), 0)


def test_match_is_the_leading_run_and_expires_after_ttl() -> None:
    memory = RoutedPrefixes(ttl_s=10.0)
    memory.add(SLOT, KEYS[:8], now=0.0)
    assert memory.match(SLOT, KEYS[:16], now=5.0) == 8
    assert memory.match(SLOT, [PageKey(1), *KEYS[:8]], now=5.0) == 0  # leading run only
    assert memory.match((WorkerId("w1"), 0), KEYS[:8], now=5.0) == 0
    assert memory.match(SLOT, KEYS[:8], now=10.5) == 0  # older than ttl
    memory.add(SLOT, KEYS[:2], now=10.5)  # routing again refreshes what it covers, expires the rest
    assert memory.match(SLOT, KEYS[:8], now=11.0) == 2
    assert memory.pages(SLOT) == 2


def test_lru_bound_trims_leaves_first_and_forget_worker() -> None:
    memory = RoutedPrefixes(max_pages_per_slot=4)
    memory.add(SLOT, KEYS[:6], now=0.0)
    assert memory.pages(SLOT) == 4 and memory.match(SLOT, KEYS[:6], now=1e9) == 4
    memory.forget_worker(WorkerId("w0"))
    assert memory.pages(SLOT) == 0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        RoutedPrefixes(max_pages_per_slot=0)
    with pytest.raises(ValueError):
        RoutedPrefixes(ttl_s=0)


def _turns(**policy: object) -> tuple[str | None, str | None, int]:
    """Turn 1 (32 pages) is routed; 10 ms later, before any KV event, turn 2 extends it."""
    d = driver(index_with(), **policy)
    ws = workers(2)
    first = d.route(RouteRequest("t1", NS, 32 * PS, KEYS[:32], PS), ws, 0.0)
    second = d.route(RouteRequest("t2", NS, 64 * PS, KEYS[:64], PS), ws, 0.01)
    return first.worker_id, second.worker_id, second.prefix_tokens


def test_next_turn_follows_a_prompt_routed_before_its_events_arrived() -> None:
    first, second, prefix = _turns()
    assert second == first and prefix == 32 * PS
    # Negative control: without the routed memory the holder looks cold and busy, so it loses.
    first, second, prefix = _turns(routed_ttl_s=0)
    assert second != first and prefix == 0


def test_settled_pages_stand_in_for_the_index_only_a_little_longer() -> None:
    memory = RoutedPrefixes(ttl_s=30.0)
    memory.add(SLOT, KEYS[:8], now=0.0)
    memory.settle(SLOT, KEYS[:4], now=1.0, within_s=5.0)  # those 4 were computed, finished at 1 s
    assert memory.match(SLOT, KEYS[:8], now=5.9) == 8
    assert memory.match(SLOT, KEYS[:8], now=6.1) == 0  # the leading run is the index's now
    assert memory.match(SLOT, KEYS[4:8], now=6.1) == 4  # not settled: ttl as before
    memory.settle(SLOT, KEYS[:8], now=2.0, within_s=60.0)  # settling never extends the ttl
    assert memory.match(SLOT, KEYS[4:8], now=30.5) == 0


def test_a_finished_turn_evicted_under_pressure_is_not_counted_after_settling() -> None:
    """Turn 1 finished on w0 and its pages were evicted there (the index, from the engine's
    events, has none); a turn 2 arriving 10 s later is priced by the index, not by what this
    router once sent there."""
    def second_prefix(**policy: object) -> int:
        d = driver(index_with(), **policy)
        ws = workers(2)
        first = d.route(RouteRequest("t1", NS, 32 * PS, KEYS[:32], PS), ws, 0.0)
        d.finished("t1", True, 1.0)
        second = d.route(RouteRequest("t2", NS, 64 * PS, KEYS[:64], PS), ws, 11.0)
        return second.prefix_tokens if second.worker_id == first.worker_id else 0

    assert second_prefix() == 0
    # Negative control: standing in for the whole ttl (the old rule) predicts 32 pages held.
    assert second_prefix(routed_settle_s=30.0) == 32 * PS


def test_a_peers_tip_covers_the_prefix_it_ends_deepest_first_per_slot() -> None:
    memory, other = RoutedPrefixes(max_tips=2), (WorkerId("w1"), 0)
    assert memory.tips(KEYS[:16], now=0.0) == {}
    memory.add_tip(SLOT, KEYS[7], now=0.0, ttl_s=10.0)  # a peer routed KEYS[:8] to w0
    memory.add_tip(SLOT, KEYS[3], now=0.0, ttl_s=10.0)  # and KEYS[:4]: the deeper one counts
    assert memory.tips(KEYS[:16], now=5.0) == {SLOT: 8}
    assert memory.tips(KEYS[:6], now=5.0) == {SLOT: 4}  # a shorter prompt: its own prefix
    assert memory.tips(KEYS[:16], now=10.5) == {}  # older than ttl
    memory.add_tip(other, KEYS[11], now=11.0, ttl_s=10.0)  # a third: the least recent goes
    assert memory.tips(KEYS[:16], now=11.0) == {other: 12}
    memory.add_tip(SLOT, KEYS[11], now=11.0, ttl_s=10.0)
    memory.forget_worker(WorkerId("w1"))
    assert memory.tips(KEYS[:16], now=11.0) == {SLOT: 12}
    with pytest.raises(ValueError):
        RoutedPrefixes(max_tips=0)


def test_next_turn_follows_a_prompt_another_router_routed_before_its_events_arrived() -> None:
    """Router A routed turn 1; router B, told its tip (the shared load view), sends turn 2 to
    the same worker before any KV event; without the tip (the negative control) B finds the
    holder cold and busier."""
    def second(told: bool) -> tuple[str | None, str | None, int]:
        a, b, ws = driver(index_with()), driver(index_with()), workers(2)
        first = a.route(RouteRequest("t1", NS, 32 * PS, KEYS[:32], PS), ws, 0.0)
        b.route(RouteRequest("x", NS, 8 * PS, [PageKey(-i) for i in range(1, 9)], PS), ws, 0.0)
        if told:
            b.policy.on_peer_routed(first.slot, KEYS[31], 0.0)
        turn2 = b.route(RouteRequest("t2", NS, 64 * PS, KEYS[:64], PS), ws, 0.01)
        return first.worker_id, turn2.worker_id, turn2.prefix_tokens

    first, then, prefix = second(told=True)
    assert then == first and prefix == 32 * PS
    first, then, prefix = second(told=False)
    assert then != first and prefix == 0
