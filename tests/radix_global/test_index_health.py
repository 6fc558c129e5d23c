"""The index's health from outside: ``/metrics`` of the service (``--metrics-port``) and of the
router's embedded index, and the standard gRPC health service."""

from __future__ import annotations

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, generate_latest

from radix_global.client import AsyncIndexClient
from radix_global.event_lag import EventLag
from radix_global.index import GlobalIndex
from radix_global.index_metrics import IndexCollector
from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.service import SERVICE_NAME, IndexServer, ServiceConfig
from radix_global.subscriber import SubscriberStats
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId

NS = Namespace("tiny@1")


def _value(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def test_the_collector_reads_the_index_and_the_feeds_when_scraped():
    index = GlobalIndex()
    index.register_namespace(NS, 4)
    feeds = SubscriberStats(2, 10, 7, {"bad_frame": 3}, gaps=1, replays=1, replay_failures=0,
                            resyncs=1, duplicates=0, timeouts=0)
    registry = CollectorRegistry()
    registry.register(IndexCollector(index.stats, lambda: feeds))
    before = generate_latest(registry).decode()
    assert _value(before, "radix_global_index_pages") == 0
    index.apply(StorePages(NS, Location(WorkerId("w"), 0, Tier.GPU), None,
                           [PageKey(1), PageKey(2)]))
    after = generate_latest(registry).decode()
    assert _value(after, "radix_global_index_pages") == 2
    assert _value(after, "radix_global_index_pages_stored_total") == 2
    assert _value(after, "radix_global_kv_event_feeds") == 2
    assert _value(after, "radix_global_kv_events_gaps_total") == 1
    assert _value(after, 'radix_global_kv_events_refused_total{reason="bad_frame"}') == 3
    assert _value(after, 'radix_global_index_tier_pages{tier="gpu"}') == 2
    assert _value(after, 'radix_global_index_tier_nodes{tier="disk"}') == 0  # every tier shown
    assert _value(after, "radix_global_kv_event_lag_seconds_count") is None  # no lag: no series
    quiet = CollectorRegistry()
    quiet.register(IndexCollector(index.stats, lambda: None))
    assert "kv_event" not in generate_latest(quiet).decode()  # no subscriber: no feed series


def test_sizes_by_tier_across_namespaces_and_after_a_restore():
    """Namespaces share one set of interned locations: the tier sizes sum over their trees, and
    a restored index counts what it restored."""
    index = GlobalIndex()
    other = Namespace("other@1")
    for ns in (NS, other):
        index.register_namespace(ns, 4)
    w, disk = WorkerId("w"), WorkerId("shm-0+disk")
    index.apply(StorePages(NS, Location(w, 0, Tier.GPU), None, [PageKey(k) for k in (1, 2, 3)]))
    index.apply(StorePages(NS, Location(w, 0, Tier.HOST), None, [PageKey(1)]))
    index.apply(StorePages(other, Location(disk, 0, Tier.POOL), None, [PageKey(9), PageKey(8)]))
    want = ({"gpu": 3, "host": 1, "pool": 0, "disk": 2}, {"gpu": 2, "host": 1, "pool": 0,
                                                          "disk": 1})
    assert (index.stats().tier_pages, index.stats().tier_nodes) == want
    restored = GlobalIndex.restore(index.snapshot())
    assert (restored.stats().tier_pages, restored.stats().tier_nodes) == want


def test_the_collector_exports_the_feeds_lag():
    lag = EventLag()
    lag.observe("w1", ts=100.0, now=100.02)
    lag.observe("w2", ts=100.0, now=99.9)  # w2's clock is ahead of ours
    lag.observe("w3", ts=float("nan"), now=100.0)  # stamps nothing usable: not counted
    feeds = SubscriberStats(2, 2, 2, {}, 0, 0, 0, 0, 0, 0, lag=lag.stats())
    registry = CollectorRegistry()
    registry.register(IndexCollector(GlobalIndex().stats, lambda: feeds))
    text = generate_latest(registry).decode()
    assert _value(text, "radix_global_kv_event_lag_seconds_count") == 2
    assert _value(text, 'radix_global_kv_event_lag_seconds_bucket{le="0.01"}') == 1  # the 0
    assert _value(text, 'radix_global_kv_event_lag_seconds_bucket{le="0.025"}') == 2
    assert _value(text, 'radix_global_kv_event_worker_lag_seconds{worker="w2"}') == \
        pytest.approx(-0.1)
    assert _value(text, 'radix_global_kv_event_worker_lag_seconds{worker="w3"}') is None


@pytest.mark.asyncio
async def test_the_service_serves_metrics_and_grpc_health():
    from radix_global.index_http import serve_metrics

    server = await IndexServer(ServiceConfig()).start()
    metrics = await serve_metrics("127.0.0.1", 0, server.state.index.stats,
                                  server.state.subscriber.stats)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for name in ("", SERVICE_NAME):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await stub.Check(health_pb2.HealthCheckRequest(service="nope"))
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        async with AsyncIndexClient(f"127.0.0.1:{server.port}") as client:
            await client.register(WorkerInfo(worker_id="w", url="http://127.0.0.1:30000",
                                             model="tiny", namespace=NS, page_size=4))
            await client.apply(StorePages(NS, Location(WorkerId("w"), 0, Tier.GPU), None,
                                          [PageKey(1), PageKey(2), PageKey(3)]))
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{metrics.port}/metrics")).text
        assert _value(text, "radix_global_index_pages") == 3
        assert _value(text, "radix_global_index_holders") == 1
        assert _value(text, "radix_global_kv_event_feeds") == 1  # tracked, though without events
    finally:
        await metrics.stop()
        await server.stop(0.1)
