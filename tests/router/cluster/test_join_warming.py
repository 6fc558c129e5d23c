"""A worker joining a warm cluster is pre-warmed (``HotPrefixWarmer.warm_joined``,
``docs/interfaces.md``, "The router's index snapshot"): the hottest prefixes of its namespace that
it does not hold, as prefix-only requests, within a page and a time budget, counted by outcome in
pages.

The engine is an ``httpx.MockTransport``; the index is the real embedded one. Controls: a worker
that holds the prefixes already (one coming back to a restored index) is sent nothing, and with
the option off nothing is sent at all."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import msgspec
import pytest
from prometheus_client import CollectorRegistry

from radix_global.keys import page_keys
from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.types import Location, Namespace, Tier, WorkerId
from router.cluster.index_link import EmbeddedIndex
from router.cluster.prefix_tokens import SHARED, WarmScope
from router.cluster.registry import Source, WorkerEntry, WorkerRegistry
from router.cluster.warming import HotPrefixWarmer, JoinWarmConfig
from router.config import ConfigError, RouterConfig

PS = 4
NS = Namespace("tiny@1")
HOT = list(range(10, 42))  # 8 pages, matched 5 times
WARM = list(range(100, 116))  # 4 pages, matched twice
NEVER_ROUTED = list(range(300, 316))  # hot, but its token ids are unknown here
NOW = 100.0


def link_with(holder: str = "a") -> EmbeddedIndex:
    link = EmbeddedIndex()
    link.index.register_namespace(NS, PS)
    for ids, hits in ((HOT, 5), (WARM, 2), (NEVER_ROUTED, 3)):
        keys = page_keys(ids, PS)
        link.index.apply(StorePages(NS, Location(WorkerId(holder), 0, Tier.GPU), None, keys))
        for t in range(hits):
            link.index.match(NS, keys, NOW - 5 + t)
    return link


def joiner(engine: str = "sglang") -> WorkerEntry:
    info = WorkerInfo(worker_id="b", url="http://b.test", model="tiny", namespace=NS,
                      page_size=PS, engine=engine)
    return WorkerEntry(info, Source.REGISTERED, 0.0)


class Clock:
    """Each request takes ``step`` seconds."""

    def __init__(self, step: float) -> None:
        self.t, self.step = NOW, step

    def __call__(self) -> float:
        return self.t


def warm(link: EmbeddedIndex, join_pages: int, entry: WorkerEntry | None = None,
         timeout_s: float = 60.0, step: float = 0.0) -> tuple[list[list[int]], dict[str, int], int]:
    sent: list[list[int]] = []
    clock = Clock(step)

    def answer(request: httpx.Request) -> httpx.Response:
        assert str(request.url) == "http://b.test/generate"
        body = json.loads(request.content)
        assert body["sampling_params"]["max_new_tokens"] == 1
        sent.append(body["input_ids"])
        clock.t += clock.step
        return httpx.Response(200, json={"text": "x"})

    async def run() -> tuple[dict[str, int], int]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            warmer = HotPrefixWarmer(link, WorkerRegistry(), client, lambda slot: 0,
                                     join=JoinWarmConfig(join_pages, timeout_s), clock=clock)
            warmer.bind_metrics(CollectorRegistry())
            for ids in (HOT, WARM):  # routed earlier: their token ids are known
                warmer.remember(NS, page_keys(ids, PS), ids, PS, prefix_tokens=len(ids),
                                scope=SHARED)
            warmer.joined(entry or joiner())
            await asyncio.gather(*warmer._in_flight)
            return dict(warmer.join_outcomes), int(
                warmer._join_metric.labels("sent")._value.get())  # type: ignore[union-attr]

    outcomes, metric = asyncio.run(run())
    return sent, outcomes, metric


def test_a_joining_worker_gets_the_hottest_prefixes_it_lacks_within_its_budget() -> None:
    sent, outcomes, metric = warm(link_with(), join_pages=64)
    assert sent == [HOT, WARM]  # hottest first
    assert outcomes == {"sent": 12, "no_tokens": 4} and metric == 12


def test_the_page_budget_stops_warming() -> None:
    sent, outcomes, _ = warm(link_with(), join_pages=10)
    assert sent == [HOT] and outcomes == {"sent": 8, "budget": 4, "no_tokens": 4}


def test_the_time_budget_stops_warming() -> None:
    sent, outcomes, _ = warm(link_with(), join_pages=64, timeout_s=10.0, step=10.0)
    assert sent == [HOT] and outcomes == {"sent": 8, "budget": 4, "no_tokens": 4}


def test_controls_a_holder_or_the_option_off_gets_nothing() -> None:
    assert warm(link_with(holder="b"), join_pages=64)[0] == []  # holds them all already
    assert warm(link_with(), join_pages=0)[0] == []
    assert warm(link_with(), join_pages=64, entry=joiner("vllm"))[0] == []  # no token-id API


def test_a_longer_hot_prefix_covers_its_own_start() -> None:
    link = link_with()
    short = page_keys(HOT, PS)[:4]
    for t in range(20):  # the first half of HOT is hotter than the whole
        link.index.match(NS, short, NOW - 2 + t * 0.1)
    sent, _, _ = warm(link, join_pages=64)
    assert sent.count(HOT) == 1 and HOT[:16] not in sent


def test_config_checks_the_budgets() -> None:
    with pytest.raises(ConfigError, match="join_warm_pages"):
        RouterConfig.from_options(join_warm_pages=-1)
    assert RouterConfig.from_options(join_warm_pages=256).join_warm.pages == 256


@pytest.mark.parametrize("join_pages", [64, 0])
def test_a_worker_registering_with_the_router_is_warmed(upstreams, router_factory,
                                                        join_pages: int) -> None:
    """Through the router: a prefix reused on worker a is remembered; worker b registers over
    the admin API and receives it as a warm request, counted in the metric (control: off)."""
    (pa, a), (pb, b) = upstreams(), upstreams()
    router = router_factory(workers=(a.url,), policy="conductor", join_warm_pages=join_pages)
    router.wait_workers(1)
    (entry,) = router.state.registry.all()
    ns = Namespace(entry.info.namespace)
    router.state.index.index.apply(StorePages(ns, Location(entry.worker_id, 0, Tier.GPU), None,
                                              page_keys(HOT, PS)))
    with router.client() as c:
        for i in range(3):  # reused: routed to its holder, hot, its token ids remembered
            assert c.post("/generate", json={"input_ids": HOT + [60 + i] * 5}).status_code == 200
        record = msgspec.structs.replace(entry.info, worker_id="late-b", url=b.url)
        assert c.post("/admin/workers", content=msgspec.json.encode(record)).status_code == 201
        deadline = time.monotonic() + 5
        while join_pages and not warm_requests(pb) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        metrics = c.get("/metrics").text
    got = warm_requests(pb)
    assert warm_requests(pa) == []
    if not join_pages:
        assert got == []
        return
    assert [r["input_ids"] for r in got] == [HOT]
    assert 'radix_global_join_warm_pages_total{outcome="sent"} 8.0' in metrics


def warm_requests(peer) -> list[dict]:
    return [body for path, body in peer.requests
            if path == "/generate" and str(body.get("rid", "")).startswith("warm-")]


@pytest.mark.parametrize("tenant, salt", [("iso", "tenant:iso"), ("pub", None)])
def test_a_tenants_prefix_is_warmed_in_the_tenants_own_namespace(
        upstreams, router_factory, tmp_path, tenant: str, salt: str | None) -> None:
    """An isolated tenant's prefix is warmed with the tenant's salt: without it the joining
    engine would cache the tenant's prompt in the shared namespace, where any client hits it
    (issue 35, item 1), and the tenant would not. A shared tenant's goes without a salt."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.iso]\napi_keys = ["k-iso"]\n'
                       '[tenants.pub]\napi_keys = ["k-pub"]\nshared = true\n')
    (_, a), (pb, b) = upstreams(), upstreams()
    router = router_factory(workers=(a.url,), policy="conductor", join_warm_pages=64,
                            tenants_file=str(tenants))
    router.wait_workers(1)
    (entry,) = router.state.registry.all()
    ns = Namespace(entry.info.namespace)
    router.state.index.index.apply(StorePages(ns, Location(entry.worker_id, 0, Tier.GPU), None,
                                              page_keys(HOT, PS, cache_salt=salt)))
    with router.client(headers={"Authorization": f"Bearer k-{tenant}"}) as c:
        for i in range(3):
            assert c.post("/generate", json={"input_ids": HOT + [60 + i] * 5}).status_code == 200
        record = msgspec.structs.replace(entry.info, worker_id="late-b", url=b.url)
        assert c.post("/admin/workers", content=msgspec.json.encode(record)).status_code == 201
        deadline = time.monotonic() + 5
        while not warm_requests(pb) and time.monotonic() < deadline:
            time.sleep(0.05)
    (got,) = warm_requests(pb)
    assert got["input_ids"] == HOT and got.get("cache_salt") == salt
    assert "lora_path" not in got


def test_an_adapters_prefix_is_warmed_with_its_adapter() -> None:
    """The scope remembered with a prompt goes out with its warm request."""
    sent: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"text": "x"})

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            warmer = HotPrefixWarmer(link_with(), WorkerRegistry(), client, lambda slot: 0,
                                     join=JoinWarmConfig(pages=64), clock=Clock(0.0))
            warmer.remember(NS, page_keys(HOT, PS), HOT, PS, prefix_tokens=len(HOT),
                            scope=WarmScope("tenant:x/s", "sql-adapter"))
            assert await warmer.warm_joined(joiner()) == 8

    asyncio.run(run())
    assert [(b["input_ids"], b["cache_salt"], b["lora_path"]) for b in sent] == \
        [(HOT, "tenant:x/s", "sql-adapter")]
