"""radix_global/wire.py: index operations survive the gRPC encoding unchanged; bad ones are
refused with a typed error."""

from __future__ import annotations

import pytest

from radix_global.ops import ClearHolder, IndexOp, MalformedEventError, RemovePages, StorePages
from radix_global.proto import index_pb2 as pb
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId
from radix_global.wire import op_from_pb, op_to_pb

NS = Namespace("m@1")
W = WorkerId("w0")
LOC = Location(W, 2, Tier.HOST)


@pytest.mark.parametrize("op", [
    StorePages(NS, LOC, None, [PageKey(1), PageKey(-2)]),
    StorePages(NS, Location(PoolId("pool"), 0, Tier.POOL), PageKey(7), [PageKey(2**63 - 1)]),
    RemovePages(NS, LOC, [PageKey(-(2**63))]),
    ClearHolder(W, None),
    ClearHolder(W, Tier.GPU),
    ClearHolder(W, None, 0),  # rank 0 is not "every rank"
    ClearHolder(W, Tier.HOST, 3),
])
def test_round_trip(op: IndexOp) -> None:
    wire = pb.IndexOp.FromString(op_to_pb(op).SerializeToString())
    assert op_from_pb(wire) == op


def test_malformed_ops_are_refused() -> None:
    with pytest.raises(MalformedEventError, match="no operation"):
        op_from_pb(pb.IndexOp())
    with pytest.raises(MalformedEventError, match="without a holder"):
        op_from_pb(pb.IndexOp(clear=pb.ClearHolder(tier=1)))
    with pytest.raises(MalformedEventError, match="unknown tier"):
        op_from_pb(pb.IndexOp(clear=pb.ClearHolder(holder="w", tier=99)))


def test_store_runs_cross_the_wire_and_broken_ones_are_dropped() -> None:
    from radix_global.ops import HolderMatch, MatchResult, StoreSpan
    from radix_global.wire import match_from_pb, match_to_pb

    a, b = WorkerId("mc@a:1"), WorkerId("mc@b:1")
    result = MatchResult(6, {(a, 0): HolderMatch(0, 0, 2)}, 4, frozenset({b}), {
        "mc": (StoreSpan(2, frozenset({a})), StoreSpan(4, frozenset({a, b})))})
    assert match_from_pb(match_to_pb(result)) == result
    bad = match_to_pb(result)
    bad.store_runs.add(store="x", spans=[pb.StoreSpan(end_page=3, segments=["x@1"]),
                                         pb.StoreSpan(end_page=3, segments=["x@2"])])
    bad.store_runs.add(store="y", spans=[pb.StoreSpan(end_page=9, segments=["y@1"])])
    bad.store_runs.add(store="z", spans=[pb.StoreSpan(end_page=1)])
    bad.store_runs.add(store="v", spans=[pb.StoreSpan(end_page=1, segments=["w@1"])])
    bad.store_runs.add(store="u", spans=[pb.StoreSpan(end_page=1, segments=["u@1+disk"])])
    # not increasing, past the query, no segment, another store's, a disk tier
    assert match_from_pb(bad).store_runs == result.store_runs
    bad.store_runs.add(store="mc", spans=[pb.StoreSpan(end_page=1, segments=["mc@a:1"])])
    assert "mc" not in match_from_pb(bad).store_runs  # named twice
    old = match_to_pb(result._replace(store_runs={}))  # an older service sends none
    assert match_from_pb(old).store_runs == {}
