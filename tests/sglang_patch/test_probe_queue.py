"""ProbeQueue: pages in demand first, then round-robin; bounded; forgotten pages reported once."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sglang_patch.pool.probe_queue import ProbeQueue


def test_pages_read_since_their_probe_come_first_the_most_read_first() -> None:
    q = ProbeQueue(10)
    for i in range(5):
        q.written(f"k{i}", i)
    for key in ["k3", "k4", "k3", "missing"]:
        q.read(key)
    assert q.next(3) == ["k3", "k4", "k0"]
    assert q.probed({"k3": True, "k4": False, "k0": True}) == [4]
    # read counts reset by the probe; the probed ones went to the back
    assert q.next(10) == ["k1", "k2", "k3", "k0"]


def test_older_pages_beyond_capacity_are_reported_once_unprobed() -> None:
    q = ProbeQueue(3)
    for i in range(5):
        q.written(f"k{i}", i)
    q.written("k2", 2)  # written again: to the back, not duplicated
    assert len(q) == 3 and q.take_forgotten() == [0, 1] and q.take_forgotten() == []
    assert q.next(5) == ["k3", "k4", "k2"]
    assert q.forget("k4") == 4 and q.forget("k4") is None
    assert sorted(q.clear()) == [2, 3] and len(q) == 0
    with pytest.raises(ValueError):
        ProbeQueue(0)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.integers(1, 5),
       st.lists(st.integers(0, 39), max_size=30))
@example(n=24, limit=7, spread=4, reads=[0, 1, 2, 3, 7, 8])  # demand spilling into round 1
def test_every_page_is_probed_within_its_bound(n: int, limit: int, spread: int,
                                               reads: list[int]) -> None:
    """Without new reads, every remembered page is probed within max(2 * spread, ceil(n / limit))
    rounds after the pages in demand, whatever was read before; and once the pages in demand
    are done, with n >= spread, none is probed twice within ``spread`` rounds."""
    q = ProbeQueue(64, spread)
    for i in range(n):
        q.written(f"k{i}", i)
    for r in reads:
        q.read(f"k{r}")
    hot = {f"k{r}" for r in reads if r < n}
    # The demand phase ends when every page in demand was probed: a round keeps room for the
    # round-robin, so it can take more than ceil(len(hot) / limit) rounds (hypothesis found
    # n=24, limit=7, spread=4 with 6 pages in demand: 4 of them in round 0, 2 in round 1).
    hot_left, done_at = set(hot), None if hot else 0
    bound = max(2 * spread, math.ceil(n / limit))
    seen: set[str] = set()
    last: dict[str, int] = {}
    for r in range(len(hot) + 3 * bound):
        if done_at is None and not hot_left:
            done_at = r
        keys = q.next(limit)
        assert 0 < len(keys) <= limit and len(set(keys)) == len(keys)
        if done_at is None or r < done_at + bound:
            seen.update(keys)
        for k in keys:
            if k in last and done_at is not None and last[k] >= done_at and n >= spread:
                assert r - last[k] >= spread, (k, last[k], r)
            last[k] = r
        hot_left -= set(keys)
        q.probed(dict.fromkeys(keys, True))
    assert seen == {f"k{i}" for i in range(n)}


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(2, 12), st.integers(1, 5), st.integers(0, 40))
def test_pages_in_demand_never_starve_the_others(n: int, limit: int, spread: int,
                                                 demand: int) -> None:
    """The same ``demand`` pages are read again every round: every other page is still probed
    within ceil(n / min(max(1, (n - demand) // spread), limit // 2)) rounds."""
    q = ProbeQueue(64, spread)
    for i in range(n):
        q.written(f"k{i}", i)
    demand = min(demand, n)
    share = min(max(1, (n - demand) // spread), limit // 2)
    seen: set[str] = set()
    for _ in range(math.ceil(n / share)):
        for i in range(demand):
            q.read(f"k{i}")
        keys = q.next(limit)
        assert len(keys) <= limit
        seen.update(keys)
        q.probed(dict.fromkeys(keys, True))
    assert {f"k{i}" for i in range(demand, n)} <= seen
