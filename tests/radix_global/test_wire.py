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
