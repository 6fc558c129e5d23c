"""router/cluster/load_reports.py: a reported load is attributed to the holder the router planned
its pages from (docs/interfaces.md, "Where hosts are", "Measured loads")."""

from __future__ import annotations

import pytest

from radix_global.pool_loads import PoolLoad, PoolLoadReport
from radix_global.registration import WorkerInfo
from radix_global.types import Namespace, PageKey, PoolId, WorkerId
from router.cluster.load_reports import LoadOutcome, LoadReports, PlannedFetches
from router.cluster.places import Places, TopologyConfig
from router.routing.contract import Decision, RouteRequest

NS, PS = Namespace("m@1"), 16
KEYS = [PageKey(100 + i) for i in range(8)]
HELD, OWN = "mooncake-m-1@10.0.1.2:1", "mooncake-m-1@10.0.2.2:1"


def test_planned_pages_expire_after_the_ttl_and_past_the_cap_oldest_first() -> None:
    planned = PlannedFetches(ttl_s=10.0, max_keys=4)
    planned.add("p", KEYS[:3], PoolId("h1"), WorkerId("w"), now=0.0)
    planned.add("p", KEYS[3:5], PoolId("h2"), WorkerId("w"), now=5.0)
    assert len(planned) == 4 and planned.source("p", KEYS[0], 5.0) is None  # pushed out
    assert planned.source("p", KEYS[1], 5.0).holder == "h1"  # type: ignore[union-attr]
    assert planned.source("q", KEYS[1], 5.0) is None  # another worker's pool
    assert planned.source("p", KEYS[1], 10.5) is None  # its 10 s are over
    assert planned.source("p", KEYS[4], 10.5).holder == "h2"  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        PlannedFetches(ttl_s=0)


def places() -> Places:
    p = Places(TopologyConfig(links={"r2": 1e6}), 1e9, 1e10)
    for wid, address, rack in (("a", "10.0.1.2", "r1"), ("c", "10.0.2.2", "r2")):
        p.joined(WorkerInfo(worker_id=wid, url=f"http://{address}:1", model="m", namespace=NS,
                            page_size=PS, pool_id=f"mooncake-m-1@{address}:1", place=rack))
    return p


def decision(local_tokens: int, fetch_tokens: int) -> Decision:
    return Decision("r", "conductor", True, WorkerId("c"), 0, local_tokens + fetch_tokens,
                    fetch_tokens, PoolId(HELD))


def test_the_fetched_pages_are_recorded_and_a_load_from_them_moves_the_slow_link() -> None:
    reports = LoadReports(places())
    req = RouteRequest("r", NS, 8 * PS, KEYS, PS)
    reports.fetch_planned(OWN, req, decision(2 * PS, 5 * PS + 3), now=0.0)  # pages 2..7
    assert len(reports.planned) == 6
    assert reports.planned.source(OWN, KEYS[1], 0.0) is None  # held locally: not fetched
    loads = [PoolLoad(int(KEYS[i]), 2, i * 500_000, float(i)) for i in (2, 3, 4, 5)]
    report = PoolLoadReport(OWN, [*loads, PoolLoad(int(KEYS[1]), 2, 500_000, 1.0)])
    assert reports.apply(report, 1.0) == {LoadOutcome.APPLIED: 4, LoadOutcome.UNATTRIBUTED: 1}
    link = reports.places.topology.bandwidth_Bps(PoolId(HELD), WorkerId("c"))
    assert link == pytest.approx(5e5)  # r2's uplink, as measured
    reports.fetch_planned(None, req, decision(0, 8 * PS), now=0.0)  # a worker without a pool
    assert len(reports.planned) == 6


def test_a_load_whose_holder_left_the_topology_is_counted_not_placed() -> None:
    reports = LoadReports(places())
    reports.fetch_planned(OWN, RouteRequest("r", NS, 8 * PS, KEYS, PS), decision(0, 8 * PS), 0.0)
    reports.places.left(WorkerId("a"))
    report = PoolLoadReport(OWN, [PoolLoad(int(KEYS[0]), 1, 10, 1.0)])
    assert reports.apply(report, 1.0) == {LoadOutcome.NOT_PLACED: 1}


def test_a_store_fetch_records_each_piece_under_its_own_segment() -> None:
    from router.routing.contract import FetchPiece

    reports = LoadReports(places())
    req = RouteRequest("r", NS, 8 * PS, KEYS, PS)
    pieces = (FetchPiece(PoolId(HELD), 0, 5, 0.1), FetchPiece(PoolId("mooncake-m-1@x:1"), 5, 8,
                                                                0.1))
    reports.fetch_planned(OWN, req, decision(0, 8 * PS)._replace(fetch_pieces=pieces), 0.0)
    assert [reports.planned.source(OWN, KEYS[i], 0.0).holder  # type: ignore[union-attr]
            for i in (0, 4, 5, 7)] == [HELD, HELD, "mooncake-m-1@x:1", "mooncake-m-1@x:1"]
    # a load within one piece measured that segment's link; one running past it, no one link
    report = PoolLoadReport(OWN, [PoolLoad(int(KEYS[2]), 3, 10**6, 1.0),
                                  PoolLoad(int(KEYS[3]), 3, 10**6, 1.0)])
    assert reports.apply(report, 1.0) == {LoadOutcome.APPLIED: 1, LoadOutcome.MIXED: 1}
