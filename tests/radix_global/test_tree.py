"""Unit tests of the pure radix tree: insert/split/merge/remove/clear, match by tier and dp rank,
hotness, and that memory is really freed."""

from __future__ import annotations

import pytest

from radix_global.hotness import Decay
from radix_global.ops import HolderMatch, StoreSpan, UnknownParentError
from radix_global.tree import KeyConflictError, RadixTree
from radix_global.types import Location, PageKey, Tier, WorkerId

A = WorkerId("a")
B = WorkerId("b")
A_GPU = Location(A, 0, Tier.GPU)
A_HOST = Location(A, 0, Tier.HOST)
A1_GPU = Location(A, 1, Tier.GPU)
B_GPU = Location(B, 0, Tier.GPU)
B_POOL = Location(B, 0, Tier.POOL)


def keys(*ks: int) -> list[PageKey]:
    return [PageKey(k) for k in ks]


def runs(tree: RadixTree) -> list[list[int]]:
    return sorted(list(n.keys) for n in tree.iter_nodes())


def test_store_builds_one_compressed_run() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2, 3))
    t.store(A_GPU, PageKey(3), keys(4, 5))  # the holder's leaf grows in place
    assert runs(t) == [[1, 2, 3, 4, 5]]
    assert t.node_count == 1 and t.page_count == 5


def test_divergence_splits_the_run() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2, 3, 4))
    t.store(B_GPU, PageKey(2), keys(7, 8))
    assert runs(t) == [[1, 2], [3, 4], [7, 8]]
    r = t.match(keys(1, 2, 7, 8), now=0.0)
    # b holds only pages 7, 8 (not 1, 2): no leading run for b
    assert r.matched == {(A, 0): HolderMatch(2, 2, 2)}
    assert r.best_pages == 2 and r.best_holders == frozenset({A})


def test_partial_location_splits_and_equal_locations_merge_back() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2, 3, 4))
    t.store(B_GPU, None, keys(1, 2))
    assert runs(t) == [[1, 2], [3, 4]]
    t.store(B_GPU, PageKey(2), keys(3, 4))  # now b covers the whole run: merged again
    assert runs(t) == [[1, 2, 3, 4]]
    t.remove(B_GPU, keys(3, 4))
    assert runs(t) == [[1, 2], [3, 4]]
    t.remove(B_GPU, keys(1, 2))
    assert runs(t) == [[1, 2, 3, 4]]


def test_match_by_tier_and_dp_rank() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2))
    t.store(A_HOST, PageKey(2), keys(3, 4))
    t.store(A1_GPU, None, keys(1, 2, 3))
    t.store(B_POOL, None, keys(1, 2, 3, 4, 5))
    r = t.match(keys(1, 2, 3, 4, 5, 6), now=1.0)
    assert r.query_pages == 6
    assert r.matched == {
        (A, 0): HolderMatch(gpu=2, host=4, pool=4),
        (A, 1): HolderMatch(gpu=3, host=3, pool=3),
        (B, 0): HolderMatch(gpu=0, host=0, pool=5),
    }
    assert r.best_pages == 5 and r.best_holders == frozenset({B})


def test_match_of_unknown_or_empty_query() -> None:
    t = RadixTree()
    assert t.match([], 0.0).best_pages == 0
    t.store(A_GPU, None, keys(1, 2))
    r = t.match(keys(9, 1, 2), 0.0)
    assert r.matched == {} and r.best_pages == 0 and r.best_holders == frozenset()


def test_match_stops_inside_a_run() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2, 3, 4, 5))
    assert t.match(keys(1, 2, 3), 0.0).matched == {(A, 0): HolderMatch(3, 3, 3)}
    assert t.match(keys(1, 2, 9, 4), 0.0).matched == {(A, 0): HolderMatch(2, 2, 2)}
    assert runs(t) == [[1, 2, 3, 4, 5]]  # a query never reshapes the tree


def test_unknown_parent_is_refused_without_change() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2))
    with pytest.raises(UnknownParentError):
        t.store(A_GPU, PageKey(99), keys(3))
    assert runs(t) == [[1, 2]] and t.page_count == 2


def test_key_conflict_is_refused_without_change() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2, 3))
    with pytest.raises(KeyConflictError):
        t.store(B_GPU, None, keys(7, 3))  # 3 already sits under 2
    with pytest.raises(KeyConflictError):
        t.store(B_GPU, None, keys(7, 8, 7))
    assert runs(t) == [[1, 2, 3]] and t.holders() == frozenset({A})


def test_restore_with_no_parent_continues_where_the_key_is() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2, 3))
    t.store(B_GPU, None, keys(2, 3, 4))  # re-store: 2 is known at depth 1
    assert runs(t) == [[1], [2, 3], [4]]
    assert t.match(keys(1, 2, 3, 4), 0.0).matched == {(A, 0): HolderMatch(3, 3, 3)}


def test_remove_unknown_keys_are_counted_and_ignored() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2))
    assert t.remove(A_GPU, keys(5, 2)) == 1
    assert t.remove(B_GPU, keys(1)) == 1  # known key, but b never held it
    assert runs(t) == [[1]]


def test_remove_middle_page_cuts_the_leading_run() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2, 3, 4))
    t.remove(A_GPU, keys(2))
    assert runs(t) == [[1], [2], [3, 4]]
    assert t.match(keys(1, 2, 3, 4), 0.0).matched == {(A, 0): HolderMatch(1, 1, 1)}
    t.store(A_GPU, PageKey(1), keys(2))
    assert runs(t) == [[1, 2, 3, 4]]


def test_clear_holder_by_tier_then_all() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2))
    t.store(A_HOST, None, keys(1, 2, 3))
    t.store(B_GPU, None, keys(1))
    t.clear_holder(A, Tier.GPU)
    assert t.match(keys(1, 2, 3), 0.0).matched[(A, 0)] == HolderMatch(0, 3, 3)
    t.clear_holder(A, None)
    assert t.holders() == frozenset({B})
    assert runs(t) == [[1]]


def test_everything_removed_frees_every_node() -> None:
    t = RadixTree()
    for w in range(5):
        loc = Location(WorkerId(f"w{w}"), 0, Tier.GPU)
        t.store(loc, None, keys(1, 2, 3))
        t.store(loc, PageKey(3), keys(100 + w, 200 + w))
    t.store(B_POOL, None, keys(1, 2, 3, 100))
    t.remove(B_POOL, keys(1, 2, 3, 100))
    for w in range(5):
        t.clear_holder(WorkerId(f"w{w}"))
    assert t.node_count == 0 and t.page_count == 0 and t.holders() == frozenset()
    assert t.root.children == {}


def test_hits_decay_with_half_life() -> None:
    t = RadixTree(Decay(half_life_s=10.0))
    t.store(A_GPU, None, keys(1, 2))
    for _ in range(4):
        t.match(keys(1, 2), now=100.0)
    (node,) = t.iter_nodes()
    assert node.hits == pytest.approx(4.0) and node.stamp == 100.0
    t.match(keys(1), now=110.0)  # one half-life later: 4 -> 2, plus this hit
    assert node.hits == pytest.approx(3.0)
    assert t.decay.value(node.hits, node.stamp, 120.0) == pytest.approx(1.5)
    assert t.decay.value(node.hits, node.stamp, 90.0) == pytest.approx(3.0)  # clock went back


def test_hot_prefixes_prefers_the_hot_shared_prefix() -> None:
    t = RadixTree(Decay(half_life_s=60.0))
    t.store(A_GPU, None, keys(1, 2, 10, 11))
    t.store(B_GPU, PageKey(2), keys(20, 21))
    t.store(A_GPU, PageKey(2), keys(30))
    for i in range(10):
        t.match(keys(1, 2, 10 if i % 2 else 20), now=float(i))
    t.match(keys(1, 2, 30), now=10.0)
    hot = t.hot_prefixes(top_k=2, now=10.0)
    assert hot[0].keys == (1, 2)  # all 11 queries went through it
    assert hot[0].holders == 1  # only a holds pages 1, 2 (b only its branch)
    assert hot[0].hit_rate > hot[1].hit_rate > 0
    assert t.hot_prefixes(top_k=5, now=1e6) == []  # cold after a long idle time


def test_a_lookup_without_a_hit_answers_the_same_and_heats_nothing() -> None:
    t = RadixTree(Decay(half_life_s=60.0))
    t.store(A_GPU, None, keys(1, 2, 10, 11))
    t.match(keys(1, 2), now=0.0)
    before = t.hot_prefixes(top_k=1, now=1.0)
    assert t.match(keys(1, 2, 10), now=1.0, hit=False) == t.match(keys(1, 2, 10), now=1.0)
    t2 = RadixTree(Decay(half_life_s=60.0))
    t2.store(A_GPU, None, keys(1, 2, 10, 11))
    t2.match(keys(1, 2), now=0.0)
    for _ in range(5):
        t2.match(keys(1, 2, 10), now=1.0, hit=False)
    assert t2.hot_prefixes(top_k=1, now=1.0) == before


def test_hot_prefixes_skips_a_node_whose_child_carries_its_hits() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2))
    t.store(B_GPU, None, keys(1, 2, 3))
    for _ in range(3):
        t.match(keys(1, 2, 3), now=0.0)
    (hot,) = t.hot_prefixes(top_k=5, now=0.0)
    assert hot.keys == (1, 2, 3) and hot.holders == 1


def test_match_accepts_any_sequence() -> None:
    t = RadixTree()
    t.store(A_GPU, None, keys(1, 2, 3))
    assert t.match((PageKey(1), PageKey(2), PageKey(4)), 0.0).matched == {
        (A, 0): HolderMatch(2, 2, 2)
    }


def test_store_runs_join_a_stores_segments_and_stop_at_a_gap() -> None:
    """docs/interfaces.md, "Mooncake Store as the L3 pool": "The run a store holds across its
    segments"."""
    t = RadixTree()
    keys = [PageKey(k) for k in range(1, 7)]
    a, b = WorkerId("mc@a:1"), WorkerId("mc@b:1")
    pool = Tier.POOL
    t.store(Location(WorkerId("w"), 0, Tier.GPU), None, keys)  # splits nodes, is no segment
    t.store(Location(WorkerId("v"), 0, Tier.GPU), None, keys[:1])  # two nodes, one span
    t.store(Location(a, 0, pool), None, keys[:2])
    t.store(Location(b, 0, pool), keys[1], keys[2:4])
    t.store(Location(a, 0, pool), keys[2], keys[3:4])
    t.store(Location(WorkerId("mc@b:1+disk"), 0, pool), keys[3], keys[4:5])  # a disk tier
    t.store(Location(b, 0, pool), keys[4], keys[5:6])  # after a gap of the store's
    got = t.match(keys, 1.0).store_runs
    assert got == {"mc": (StoreSpan(2, frozenset({a})), StoreSpan(3, frozenset({b})),
                          StoreSpan(4, frozenset({a, b})))}
    assert t.match(keys[1:], 1.0).store_runs == {}  # a run starts at the query's first page
    t.store(Location(b, 0, pool), None, keys[:1])
    t.remove(Location(a, 0, pool), keys[:1])
    assert t.match(keys, 1.0).store_runs == {"mc": (
        StoreSpan(1, frozenset({b})), StoreSpan(2, frozenset({a})), StoreSpan(3, frozenset({b})),
        StoreSpan(4, frozenset({a, b})))}

