"""router/routing/topology.py: bottleneck bandwidth and EWMA correction."""

from __future__ import annotations

import pytest

from radix_global.types import PoolId, WorkerId
from router.routing.link_fit import LinkFit
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


def test_measured_transfers_set_the_bottleneck_once_enough_of_them_weigh_in() -> None:
    t = Topology()
    t.add_link("h0", "tor", 1000.0)
    t.add_link("h1", "tor", 300.0)
    t.place(P, "h0")
    t.place(A, "h1")
    for _ in range(3):
        t.observe_transfer(P, A, nbytes=50, seconds=1.0)
    assert t.bandwidth_Bps(P, A) == 300.0  # three samples: the configured link still
    t.observe_transfer(P, A, nbytes=0, seconds=1.0)  # ignored
    t.observe_transfer(P, A, nbytes=150, seconds=2.0)  # 4th: 0.5 s a transfer + 100 B/s
    assert t.bandwidth_Bps(P, A) == pytest.approx(100.0)
    assert t.overhead_s(P, A) == pytest.approx(0.5)
    assert t.overhead_s(P, P) == 0.0  # one host's memory, unmeasured


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


def quick() -> LinkFit:
    return LinkFit(min_samples=1)


def test_a_measured_local_copy_moves_only_that_hosts_memory_path() -> None:
    t = Topology(local_bandwidth_Bps=100.0, fit=quick)
    t.add_link("h0", "tor", 10.0)
    t.add_link("h1", "tor", 10.0)
    t.place(P, "h0")
    t.place(A, "h0")
    t.place(B, "h1")
    t.place(PoolId("q"), "h1")
    t.observe_transfer(P, A, nbytes=50, seconds=1.0)
    assert t.bandwidth_Bps(P, A) == pytest.approx(50.0)
    assert t.bandwidth_Bps(PoolId("q"), B) == 100.0  # the other host's memory: as configured
    assert t.report()["local"] == {"h0": {"bandwidth_Bps": pytest.approx(50.0),
                                          "overhead_s": 0.0, "samples": 1.0}}


def test_configuring_a_link_again_keeps_what_was_measured_unless_its_figure_changes() -> None:
    t = Topology(fit=quick)
    t.add_link("h0", "tor", 200.0)
    t.add_link("h1", "tor", 100.0)
    t.place(P, "h0")
    t.place(A, "h1")
    t.observe_transfer(P, A, nbytes=50, seconds=1.0)  # h1's link is the bottleneck
    t.add_link("h1", "tor", 100.0)  # the same figure: a re-registration
    assert t.bandwidth_Bps(P, A) == pytest.approx(50.0)
    t.add_link("h1", "tor", 300.0)  # a new figure: the measurement is dropped
    assert t.bandwidth_Bps(P, A) == pytest.approx(200.0)  # h0's link now
    link = next(x for x in t.report()["links"] if "h1" in (x["a"], x["b"]))
    assert link["configured_Bps"] == link["bandwidth_Bps"] == 300.0


def test_a_dropped_node_takes_its_links_and_cut_paths_are_recomputed() -> None:
    t = star_cluster({"h0": [P], "h1": [A]}, nic_Bps=100.0)
    assert t.bandwidth_Bps(P, A) == 100.0
    t.cut("h1", ("switch", "tor"))
    with pytest.raises(TopologyError, match="no path"):
        t.bandwidth_Bps(P, A)
    t.remove(A)
    t.drop_node("h1")
    assert t.neighbours("h1") == [] and not t.knows(A)
    assert t.neighbours("h0") == [("switch", "tor")]
