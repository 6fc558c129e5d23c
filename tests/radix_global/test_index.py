"""The GlobalIndex facade: namespaces, typed ops, counted refusals, stats, snapshot/restore."""

from __future__ import annotations

import msgspec
import pytest

from radix_global.index import GlobalIndex
from radix_global.ops import (
    ClearHolder,
    HolderMatch,
    MalformedEventError,
    PageSizeMismatchError,
    RemovePages,
    StorePages,
    UnknownNamespaceError,
    UnknownParentError,
)
from radix_global.tree import KeyConflictError
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId

NS = Namespace("tiny@1")
OTHER = Namespace("tiny@2")
W0, W1, POOL = WorkerId("w0"), WorkerId("w1"), PoolId("shm-0")
W0_GPU = Location(W0, 0, Tier.GPU)
W0_HOST = Location(W0, 0, Tier.HOST)
W1_GPU = Location(W1, 0, Tier.GPU)
POOL_LOC = Location(POOL, 0, Tier.POOL)


def k(*ks: int) -> list[PageKey]:
    return [PageKey(x) for x in ks]


def make() -> GlobalIndex:
    idx = GlobalIndex(half_life_s=30.0)
    idx.register_namespace(NS, 64)
    idx.register_namespace(OTHER, 16)
    return idx


def test_namespaces_are_separate_trees_with_fixed_page_size() -> None:
    idx = make()
    idx.register_namespace(NS, 64)  # same size again: fine
    with pytest.raises(PageSizeMismatchError):
        idx.register_namespace(NS, 32)
    assert idx.page_size(NS) == 64 and idx.page_size(OTHER) == 16
    idx.apply(StorePages(NS, W0_GPU, None, k(1, 2)))
    assert idx.match(OTHER, k(1, 2), 0.0).best_pages == 0
    assert idx.match(NS, k(1, 2), 0.0).matched == {(W0, 0): HolderMatch(2, 2, 2)}
    assert idx.stats().refused == {"page_size_mismatch": 1}


def test_refusals_are_typed_counted_and_change_nothing() -> None:
    idx = make()
    idx.apply(StorePages(NS, W0_GPU, None, k(1, 2)))
    before = idx.snapshot()
    with pytest.raises(UnknownParentError):
        idx.apply(StorePages(NS, W0_GPU, PageKey(77), k(3)))
    with pytest.raises(UnknownNamespaceError):
        idx.apply(StorePages(Namespace("nope@1"), W0_GPU, None, k(3)))
    with pytest.raises(UnknownNamespaceError):
        idx.match(Namespace("nope@1"), k(1), 0.0)
    with pytest.raises(KeyConflictError):
        idx.apply(StorePages(NS, W1_GPU, None, k(9, 2)))
    with pytest.raises(MalformedEventError):
        idx.apply(StorePages(NS, Location(W0, 0, 7), None, k(5)))  # type: ignore[arg-type]
    with pytest.raises(MalformedEventError):
        idx.apply("BlockStored")  # type: ignore[arg-type]
    assert idx.snapshot() == before
    s = idx.stats()
    assert s.refused == {
        "unknown_parent": 1,
        "unknown_namespace": 2,
        "key_conflict": 1,
        "malformed": 2,
    }
    assert s.ops_applied == 1


def test_remove_clear_and_remove_holder_free_entries() -> None:
    idx = make()
    idx.apply(StorePages(NS, W0_GPU, None, k(1, 2, 3)))
    idx.apply(StorePages(NS, W0_HOST, None, k(1, 2, 3, 4)))
    idx.apply(StorePages(OTHER, W0_GPU, None, k(1)))
    idx.apply(StorePages(NS, POOL_LOC, None, k(1, 2)))
    idx.apply(RemovePages(NS, W0_GPU, k(3, 99)))
    assert idx.match(NS, k(1, 2, 3, 4), 0.0).matched[(W0, 0)] == HolderMatch(2, 4, 4)
    idx.apply(ClearHolder(W0, Tier.HOST))
    assert idx.match(NS, k(1, 2, 3, 4), 0.0).matched[(W0, 0)] == HolderMatch(2, 2, 2)
    idx.remove_holder(W0)  # every namespace
    s = idx.stats()
    assert (s.pages, s.nodes, s.holders) == (2, 1, 1)
    assert s.unknown_removed == 1 and s.pages_removed == 2 and s.pages_stored == 10
    idx.apply(ClearHolder(POOL, None))
    s = idx.stats()
    assert (s.pages, s.nodes, s.holders) == (0, 0, 0)


def test_clear_of_one_dp_rank_keeps_the_other_ranks() -> None:
    idx = make()
    for rank in (0, 1):
        idx.apply(StorePages(NS, Location(W0, rank, Tier.GPU), None, k(1, 2)))
    idx.apply(ClearHolder(W0, None, 1))
    matched = idx.match(NS, k(1, 2), 0.0).matched
    assert matched == {(W0, 0): HolderMatch(2, 2, 2)}
    idx.apply(ClearHolder(W0, None))  # every rank
    assert idx.match(NS, k(1, 2), 0.0).matched == {}


def test_snapshot_is_plain_data_and_restores_the_same_answers() -> None:
    idx = make()
    idx.apply(StorePages(NS, W0_GPU, None, k(1, 2, 3, 4)))
    idx.apply(StorePages(NS, W1_GPU, PageKey(2), k(5, 6)))
    idx.apply(StorePages(NS, POOL_LOC, None, k(1, 2, 3)))
    idx.apply(StorePages(OTHER, W1_GPU, None, k(1)))
    for t in range(5):
        idx.match(NS, k(1, 2, 5), float(t))
    data = idx.snapshot()
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(data))  # what a service would send
    copy = GlobalIndex.restore(wire)
    assert copy.snapshot() == data
    assert copy.stats()._replace(ops_applied=0, pages_stored=0) == idx.stats()._replace(
        ops_applied=0, pages_stored=0
    )
    for q in (k(1, 2, 3, 4), k(1, 2, 5, 6), k(1)):
        assert copy.match(NS, q, 10.0) == idx.match(NS, q, 10.0)
    assert copy.hot_prefixes(NS, 3, 10.0) == idx.hot_prefixes(NS, 3, 10.0)
    copy.remove_holder(W0)
    copy.remove_holder(W1)
    copy.remove_holder(POOL)
    assert copy.stats().nodes == 0


def test_restore_refuses_bad_data() -> None:
    data = make().snapshot()
    with pytest.raises(MalformedEventError):
        GlobalIndex.restore({**data, "version": 99})
    with pytest.raises(MalformedEventError):
        GlobalIndex.restore({"version": 1})
    bad = {
        **data,
        "namespaces": [
            {
                "namespace": "x@1",
                "page_size": 4,
                "clock": 0.0,
                "nodes": [[-1, [1], [["w0", 0, 9]], 0.0, 0.0]],
            }
        ],
    }
    with pytest.raises(MalformedEventError):
        GlobalIndex.restore(bad)


def test_hot_prefixes_through_the_facade() -> None:
    idx = make()
    idx.apply(StorePages(NS, W0_GPU, None, k(1, 2)))
    idx.apply(StorePages(NS, W1_GPU, None, k(1, 2)))
    idx.apply(StorePages(NS, W1_GPU, PageKey(2), k(3)))
    for t in range(4):
        idx.match(NS, k(1, 2), float(t))
    (hot,) = idx.hot_prefixes(NS, 1, 4.0)
    assert hot.keys == (1, 2) and hot.pages == 2 and hot.holders == 2 and hot.hit_rate > 0
