"""The one-pass capacity curve against an LRU cache simulated at each capacity (hypothesis)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId
from radix_global_tools.plan.capacity_curve import capacity_curve
from radix_global_tools.simulate.instances import PageCache
from radix_global_tools.simulate.workload import SimRequest, full_page_keys

PAGE = 4


def reused_with_lru(requests: list[SimRequest], capacity_pages: int) -> int:
    """What a real simulator cache of that size reuses, request after request."""
    cache = PageCache(Namespace("n"), Location(WorkerId("w"), 0, Tier.HOST), capacity_pages)
    reused = 0
    for r in requests:
        keys = full_page_keys(r, PAGE)
        hit = cache.prefix_pages(keys)
        reused += min(hit * PAGE, max(0, r.input_tokens - 1))
        cache.insert(keys)
    return reused


def requests_from(chains: list[tuple[int, int, int]]) -> list[SimRequest]:
    """(conversation, turns so far, extra tokens): turn k of a conversation extends turn k-1."""
    out = []
    for i, (conv, turns, extra) in enumerate(chains):
        keys = tuple(PageKey(conv * 100 + k) for k in range(turns))
        out.append(SimRequest(f"r{i}", float(i), turns * PAGE + extra, 1, keys))
    return out


chains_st = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6), st.integers(0, PAGE - 1)),
                     min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(chains_st)
def test_the_curve_is_lru_at_every_capacity(chains: list[tuple[int, int, int]]) -> None:
    reqs = requests_from(chains)
    curve = capacity_curve(reqs, PAGE)
    total = sum(r.input_tokens for r in reqs)
    for capacity in range(6, 40):  # at least the longest chain: PageCache keeps it whole
        want = reused_with_lru(reqs, capacity) / total
        assert abs(curve.hit_rate(capacity * PAGE) - want) < 1e-12, capacity


def test_unbounded_is_every_page_seen_before() -> None:
    reqs = requests_from([(0, 2, 1), (0, 3, 0), (1, 1, 0), (0, 4, 2)])
    curve = capacity_curve(reqs, PAGE)
    # reused: 0, 2 pages, 0, 3 pages
    assert curve.reused_tokens[-1] == 2 * PAGE + 3 * PAGE
    assert curve.max_hit_rate == curve.hit_rate(math.inf)
    assert curve.capacity_for(curve.max_hit_rate) > 0
    assert curve.capacity_for(1.0) == -1
    assert curve.capacity_for(0.0) == 0
