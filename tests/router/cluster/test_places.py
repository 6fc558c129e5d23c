"""router/cluster/places.py: the topology built from the workers' places, and what the conductor
makes of it (docs/interfaces.md, "Where hosts are")."""

from __future__ import annotations

import pytest

from radix_global.index import GlobalIndex
from radix_global.ops import StorePages
from radix_global.registration import RegistrationError, WorkerInfo
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId
from router.cluster.places import Places, TopologyConfig
from router.routing.contract import RouteRequest, WorkerState
from router.routing.cost import CostConfig, CostModel
from router.routing.driver import PolicyDriver
from router.routing.policies.conductor import ConductorPolicy
from router.routing.prefill_model import PrefillModel

NS, PS = Namespace("m@1"), 16
KEYS = [PageKey(1000 + i) for i in range(64)]  # a 1,024-token prompt
NIC, SLOW, MEMORY = 1.25e9, 6.25e6, 10e9  # a 10 Gbit/s NIC, a 50 Mbit/s inter-rack link


def segment(address: str) -> str:
    return f"mooncake-m-50051@{address}:30000"


def info(wid: str, address: str, place: str | None, pool: str | None = "segment"
         ) -> WorkerInfo:
    pool_id = segment(address) if pool == "segment" else pool
    return WorkerInfo(worker_id=wid, url=f"http://{address}:8000", model="m", namespace=NS,
                      page_size=PS, pool_id=pool_id, place=place)


def two_racks(**config: object) -> Places:
    places = Places(TopologyConfig(**config), NIC, MEMORY)  # type: ignore[arg-type]
    places.joined(info("a1", "10.0.1.2", "r1"))
    places.joined(info("a2", "10.0.1.3", "r1"))
    places.joined(info("c1", "10.0.2.2", "r2"))
    return places


def test_a_fetch_across_the_slow_uplink_is_priced_at_it_and_one_within_the_rack_at_the_nic(
        ) -> None:
    topo = two_racks(links={"r2": SLOW}).topology
    held = PoolId(segment("10.0.1.2"))
    assert topo.bandwidth_Bps(held, WorkerId("a2")) == NIC
    assert topo.bandwidth_Bps(held, WorkerId("c1")) == SLOW
    assert topo.bandwidth_Bps(held, WorkerId("a1")) == MEMORY  # its own host
    assert topo.path(held, WorkerId("c1")) == [
        "host:10.0.1.2", "domain:r1", "domain:", "domain:r2", "host:10.0.2.2"]


def test_without_places_the_topology_prices_as_hosts_did_before_it() -> None:
    """No worker names a place: every host hangs off the root, so the figures are the ones the
    cost model used without a topology (same host: memory; another host: the remote bandwidth)."""
    places = Places(TopologyConfig(), NIC, MEMORY)
    plain = CostModel(CostConfig(remote_segment_bandwidth_Bps=NIC, default_bandwidth_Bps=MEMORY))
    for wid, address in (("a1", "10.0.1.2"), ("b1", "10.0.1.3"), ("b2", "10.0.1.3")):
        places.joined(info(wid, address, None, pool="segment" if wid != "b2" else None))
    for holder in (segment("10.0.1.2"), segment("10.0.1.3")):
        for wid, own in (("a1", "10.0.1.2"), ("b1", "10.0.1.3")):
            assert places.topology.bandwidth_Bps(PoolId(holder), WorkerId(wid)) == \
                plain.bandwidth_Bps(PoolId(holder), WorkerId(wid), PoolId(segment(own)))


def test_zones_and_named_uplinks() -> None:
    places = Places(TopologyConfig(uplink_Bps=5e9, links={"z1": 2e9}), 4 * NIC, MEMORY)
    places.joined(info("a", "10.0.1.2", "z1/r1"))
    places.joined(info("b", "10.0.1.3", "z1/r2"))
    places.joined(info("c", "10.0.2.2", "z2/r1"))
    topo, held = places.topology, PoolId(segment("10.0.1.2"))
    assert topo.path(held, WorkerId("b"))[1:-1] == ["domain:z1/r1", "domain:z1", "domain:z1/r2"]
    assert topo.bandwidth_Bps(held, WorkerId("b")) == 4 * NIC  # the NICs
    assert topo.bandwidth_Bps(held, WorkerId("c")) == 2e9  # z1's uplink


def test_hosts_move_and_leave_with_their_workers_and_a_shared_pool_stays() -> None:
    places = Places(TopologyConfig(), NIC, MEMORY)
    places.joined(info("a", "10.0.1.2", "r1", pool="shm-h"))
    places.joined(info("b", "10.0.1.2", "r1", pool="shm-h"))
    places.left(WorkerId("a"))
    topo = places.topology
    assert topo.knows(PoolId("shm-h")) and topo.knows(WorkerId("b"))
    places.joined(info("b", "10.0.1.2", "r9", pool="shm-h"))  # re-registered elsewhere
    assert topo.neighbours("host:10.0.1.2") == ["domain:r9"]
    places.left(WorkerId("b"))
    assert not topo.knows(PoolId("shm-h")) and topo.neighbours("host:10.0.1.2") == []


def test_measured_loads_refine_the_link_unless_learning_is_off() -> None:
    places = two_racks(links={"r2": SLOW})
    held = PoolId(segment("10.0.1.2"))
    for size in (1, 2, 3, 4):  # half as fast as configured, and 20 ms a load
        assert places.observe(held, WorkerId("c1"), nbytes=int(size * SLOW),
                              seconds=0.02 + 2.0 * size)
    assert places.topology.bandwidth_Bps(held, WorkerId("c1")) == pytest.approx(SLOW / 2)
    assert places.topology.overhead_s(held, WorkerId("c1")) == pytest.approx(0.02)
    assert places.topology.bandwidth_Bps(held, WorkerId("a2")) == NIC  # another path
    assert not places.observe(PoolId("unknown"), WorkerId("c1"), 1, 1.0)
    frozen = two_racks(links={"r2": SLOW}, learn=False)
    for size in (1, 2, 3, 4):
        assert not frozen.observe(held, WorkerId("c1"), nbytes=int(size * SLOW), seconds=size)
    assert frozen.topology.bandwidth_Bps(held, WorkerId("c1")) == SLOW


def test_bad_places_and_links_are_refused() -> None:
    for bad in ("", "a//b", "a b", "a/b/c/d/e", "x" * 64, "rack/"):
        with pytest.raises(RegistrationError, match="place"):
            info("w", "10.0.0.1", bad)
    with pytest.raises(RegistrationError, match="place"):
        TopologyConfig(links={"bad place": 1.0})
    with pytest.raises(ValueError, match="> 0"):
        TopologyConfig(links={"r1": 0.0})


def conductor(places: Places | None, index: GlobalIndex) -> PolicyDriver:
    # ~0.1 s to prefill 1,024 tokens cold; 64 KiB a token: 64 MiB, 0.05 s over a 10 Gbit/s NIC,
    # 10.7 s over the 50 Mbit/s uplink
    cost = CostModel(CostConfig(kv_bytes_per_token=64 * 1024, remote_segment_bandwidth_Bps=NIC,
                                default_bandwidth_Bps=MEMORY),
                     places.topology if places is not None else None,
                     prefill_prior=lambda: PrefillModel.calibrated(0.001, 1e-4, 1e-9))
    return PolicyDriver(ConductorPolicy(), cost, index)


def held_in_a1s_segment() -> GlobalIndex:
    idx = GlobalIndex()
    idx.register_namespace(NS, PS)
    idx.apply(StorePages(NS, Location(PoolId(segment("10.0.1.2")), 0, Tier.POOL), None, KEYS))
    return idx


def state(wid: str, address: str) -> WorkerState:
    return WorkerState(WorkerId(wid), NS, pool_id=PoolId(segment(address)))


def test_the_conductor_fetches_within_the_rack_and_recomputes_across_the_slow_link() -> None:
    """a1's segment holds the prompt, a1 is not a candidate (drained). Across the slow uplink
    the fetch costs more than the prefill: c1 alone recomputes, and between the two the in-rack
    a2 wins with a fetch. Negative control: without the topology, c1's fetch is priced at the
    NIC and planned."""
    req = RouteRequest("r", NS, 64 * PS, KEYS, PS)
    placed = conductor(two_racks(links={"r2": SLOW}), held_in_a1s_segment())
    alone = placed.estimate(req, [state("c1", "10.0.2.2")], 0.0)
    assert alone.worker_id == "c1" and alone.fetch_tokens == 0 and alone.fetch_from is None
    both = placed.estimate(req, [state("c1", "10.0.2.2"), state("a2", "10.0.1.3")], 0.0)
    assert both.worker_id == "a2" and both.fetch_from == PoolId(segment("10.0.1.2"))
    assert both.fetch_tokens == 64 * PS
    blind = conductor(None, held_in_a1s_segment()).estimate(req, [state("c1", "10.0.2.2")], 0.0)
    assert blind.fetch_from == PoolId(segment("10.0.1.2")) and blind.fetch_tokens > 0
