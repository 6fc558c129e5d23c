"""router/routing/topology.py: bottleneck bandwidth and EWMA correction."""

from __future__ import annotations

import pytest

from radix_global.types import PoolId, WorkerId
from router.routing.link_fit import LinkFit, LinkStats
from router.routing.topology import GBPS, Topology, TopologyError, link_key, star_cluster

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
                                          "overhead_s": 0.0, "samples": 1.0,
                                          "peer_samples": 0}}


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


def _two_hosts(fit=quick) -> Topology:
    t = Topology(local_bandwidth_Bps=100.0, fit=fit)
    t.add_link("h0", "tor", 200.0)
    t.add_link("h1", "tor", 100.0)
    t.place(P, "h0")
    t.place(A, "h1")
    return t


def test_a_peers_measured_link_prices_this_routers_fetches_until_it_is_gone() -> None:
    """Several routers (docs/interfaces.md, "Where hosts are"): one router measured h1's link,
    the other prices on it; its record gone, the link is as configured again."""
    measured = _two_hosts()
    measured.observe_transfer(P, A, nbytes=50, seconds=1.0)
    links = measured.own_links()
    assert set(links) == {("h1", "tor")}
    other = _two_hosts()
    assert other.bandwidth_Bps(P, A) == 100.0
    other.share("r0", links)
    assert other.bandwidth_Bps(P, A) == pytest.approx(50.0)
    (link,) = [x for x in other.report()["links"] if x["a"] == "h1" or x["b"] == "h1"]
    assert (link["samples"], link["peer_samples"]) == (0, 1)
    assert other.own_links() == {}  # a peer's sums are not this router's to share again
    other.unshare("r0")
    assert other.bandwidth_Bps(P, A) == 100.0 and other.peers() == []


def test_every_routers_samples_make_one_fit() -> None:
    """Each of two routers saw two of a link's four loads (10 ms + 1 byte/s), fewer than a
    fit needs; together they price the link as one router that saw all four."""
    def fit() -> LinkFit:
        return LinkFit(half_life=float("inf"), min_samples=4)

    loads = [(size, 0.01 + size) for size in (1, 2, 3, 4)]
    alone, r0, r1 = _two_hosts(fit), _two_hosts(fit), _two_hosts(fit)
    for nbytes, seconds in loads:
        alone.observe_transfer(P, A, nbytes, seconds)
    for nbytes, seconds in loads[:2]:
        r0.observe_transfer(P, A, nbytes, seconds)
    for nbytes, seconds in loads[2:]:
        r1.observe_transfer(P, A, nbytes, seconds)
    assert r0.bandwidth_Bps(P, A) == 100.0  # 2 samples: under min_samples
    r0.share("r1", r1.own_links())
    assert r0.link(P, A) == pytest.approx(alone.link(P, A))
    assert r0.link(P, A) == pytest.approx((1.0, 0.01))


def test_a_peers_link_this_topology_lacks_counts_once_the_link_is_added() -> None:
    t = Topology(fit=quick)
    t.share("r0", {("h1", "tor"): LinkStats(1, 1.0, 50.0, 1.0, 2500.0, 50.0)})
    t.add_link("h0", "tor", 200.0)
    t.add_link("h1", "tor", 100.0)
    t.place(P, "h0")
    t.place(A, "h1")
    assert t.bandwidth_Bps(P, A) == pytest.approx(50.0)


def test_a_peers_memory_path_prices_a_copy_on_that_host() -> None:
    t = Topology(local_bandwidth_Bps=100.0, fit=quick)
    t.place(P, "h0")
    t.place(A, "h0")
    t.share("r0", {("h0", "h0"): LinkStats(1, 1.0, 50.0, 1.0, 2500.0, 50.0)})
    assert t.bandwidth_Bps(P, A) == pytest.approx(50.0)
    assert t.report()["local"]["h0"]["peer_samples"] == 1
    t.unshare("r0")
    assert t.bandwidth_Bps(P, A) == 100.0


@pytest.mark.parametrize("stats", [
    LinkStats(4, 1.0, 0.0, 1.0, 0.0, 0.0),  # no bytes: a bandwidth of 0 would divide by it
    LinkStats(4, 1.0, 1e300, 1.0, 1e300, 1e300),  # squares past a float's range
    LinkStats(4, 1e-300, 1.0, 1.0, 1.0, 1.0),
])
def test_sums_a_peer_should_never_send_do_not_break_pricing(stats: LinkStats) -> None:
    """(The coordination reader refuses these: ``records.link_stats``.) Pricing stays a
    positive finite figure, and learning and the report go on."""
    t = _two_hosts()
    t.share("r0", {("h1", "tor"): stats})
    bandwidth, overhead = t.link(P, A)
    assert 0 < bandwidth < float("inf") and 0 <= overhead < float("inf")
    if stats.x == 0:  # describes no link: as configured
        assert (bandwidth, overhead) == (100.0, 0.0)
    t.observe_transfer(P, A, nbytes=50, seconds=1.0)
    assert t.report()["links"]


def test_a_peers_link_is_found_whichever_way_the_edge_was_added() -> None:
    t = Topology(fit=quick)
    t.add_link("tor", "h1", 100.0)
    t.add_link("h0", "tor", 200.0)
    t.place(P, "h0")
    t.place(A, "h1")
    t.share("r0", {link_key("h1", "tor"): LinkStats(1, 1.0, 50.0, 1.0, 2500.0, 50.0)})
    assert t.bandwidth_Bps(P, A) == pytest.approx(50.0)
