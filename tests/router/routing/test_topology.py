"""router/routing/topology.py: bottleneck bandwidth and EWMA correction."""

from __future__ import annotations

import pytest

from radix_global.types import PoolId, WorkerId
from router.routing.topology import GBPS, Topology, TopologyError, star_cluster

A, B, P = WorkerId("a"), WorkerId("b"), PoolId("p")


def test_path_bandwidth_is_the_smallest_link_on_the_path() -> None:
    t = Topology(local_bandwidth_Bps=50e9)
    t.add_link("host0", "nic0", 400 * GBPS)
    t.add_link("nic0", "tor", 200 * GBPS)
    t.add_link("tor", "host1", 100 * GBPS)
    t.place(P, "host0")
    t.place(A, "host1")
    t.place(B, "host0")
    assert t.bandwidth_Bps(P, A) == pytest.approx(100 * GBPS)
    assert t.bandwidth_Bps(P, B) == 50e9  # same host: memory copy
    assert t.path(P, A) == ["host0", "nic0", "tor", "host1"]


def test_measured_transfers_move_the_bottleneck_by_ewma() -> None:
    t = star_cluster({"h0": [P], "h1": [A]}, nic_Bps=100.0)
    t.ewma_alpha = 0.5
    t.observe_transfer(P, A, nbytes=50, seconds=1.0)
    assert t.bandwidth_Bps(P, A) == pytest.approx(75.0)
    t.observe_transfer(P, A, nbytes=0, seconds=1.0)  # ignored
    assert t.bandwidth_Bps(P, A) == pytest.approx(75.0)


def test_unknown_or_unreachable_holders_are_typed_errors() -> None:
    t = Topology()
    t.place(A, "island0")
    t.place(B, "island1")
    with pytest.raises(TopologyError, match="no path"):
        t.bandwidth_Bps(A, B)
    with pytest.raises(TopologyError, match="not placed"):
        t.bandwidth_Bps(A, P)
    with pytest.raises(ValueError):
        t.add_link("x", "y", 0)
