"""Hot-prefix warming executed (router/cluster/warming.py, planned by
router/cluster/replication.py): the router
remembers the token ids of prompts that reused a prefix, and when that prefix is hot and every
holder is busy it sends a lightly loaded worker a prefix-only ``/generate`` with
``max_new_tokens=1``, at most once per (prefix, worker) per cooldown, counted in
``radix_global_warm_actions_total``. Workers are real HTTP peers speaking SGLang's protocol."""

from __future__ import annotations

import time

import httpx
import pytest

from radix_global.keys import page_keys
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId
from router.cluster.discovery import cli_worker_id
from router.cluster.prefix_tokens import SHARED, PrefixTokens
from router.cluster.replication import WarmConfig, WarmupPlanner
from router.routing.contract import Decision, RouteRequest

PS = 4
PREFIX = list(range(10, 42))  # 8 pages


def test_prefix_tokens_finds_any_leading_run_and_is_bounded() -> None:
    ids = [*PREFIX, 50, 51, 52, 53, 54]
    keys = page_keys(ids, PS)
    book = PrefixTokens(max_pages=20)
    book.remember("ns", keys, ids, PS, SHARED)
    assert book.tokens("ns", keys[:3]) == (ids[:12], SHARED)
    assert book.tokens("ns", keys) == (ids[:36], SHARED)
    assert book.tokens("other", keys[:3]) is None
    assert book.tokens("ns", [keys[1]]) is None  # a key at another depth: not this chain
    assert book.tokens("ns", []) is None
    for n in range(3):  # 3 more prompts of 9 pages: the first ones are evicted (20 pages max)
        more = [200 + n, *ids[1:]]
        book.remember("ns", page_keys(more, PS), more, PS, SHARED)
    assert book.tokens("ns", keys[:3]) is None and len(book) == 2
    with pytest.raises(ValueError):
        PrefixTokens(max_pages=0)


def _busy(state, worker: WorkerId, count: int) -> None:
    for i in range(count):
        rid = f"bg-{worker}-{i}"
        req = RouteRequest(rid, Namespace("x"), 8, [PageKey(900 + i)], PS)
        state.routing.cost.on_routed(req, Decision(rid, "t", accepted=True, worker_id=worker,
                                                   dp_rank=0), time.monotonic())


def _setup(upstreams, router_factory, warm_interval_s: float):
    (pa, a), (pb, b) = upstreams(), upstreams()
    router = router_factory(workers=(a.url, b.url), policy="conductor",
                            warm_interval_s=warm_interval_s)
    router.wait_workers(2)
    wa, wb = WorkerId(cli_worker_id(a.url)), WorkerId(cli_worker_id(b.url))
    ns = Namespace(next(iter(router.state.registry.models().values())))
    router.state.warmer.planner = WarmupPlanner(WarmConfig(min_hit_rate=0.01, cooldown_s=60))
    router.state.index.index.apply(StorePages(ns, Location(wa, 0, Tier.GPU), None,
                                              page_keys(PREFIX, PS)))
    return router, pa, pb, wa, wb


def _warm_requests(peer) -> list[dict]:
    return [b for p, b in peer.requests if p == "/generate" and str(b.get("rid", "")).startswith(
        "warm-")]


@pytest.mark.parametrize("warm", [True, False])
def test_hot_prefix_is_warmed_on_the_idle_worker(upstreams, router_factory, warm: bool) -> None:
    router, pa, pb, wa, _wb = _setup(upstreams, router_factory, 0.2 if warm else 0.0)
    with router.client() as c:
        for i in range(3):  # the prefix is reused: routed to its holder, hot, remembered
            r = c.post("/generate", json={"input_ids": PREFIX + [60 + i] * 5})
            assert r.status_code == 200 and r.headers["x-radix-worker"] == wa
        _busy(router.state, wa, 3)  # its only holder is now busy, the other worker idle
        deadline = time.monotonic() + 5
        while warm and not _warm_requests(pb) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # several more planning rounds: the cooldown holds
        metrics = c.get("/metrics").text
    got = _warm_requests(pb)
    if not warm:  # negative control: planned nowhere, sent nowhere
        assert got == [] and _warm_requests(pa) == []
        return
    assert len(got) == 1, got
    assert got[0]["input_ids"] == PREFIX
    assert got[0]["sampling_params"]["max_new_tokens"] == 1
    assert _warm_requests(pa) == []
    assert 'radix_global_warm_actions_total{outcome="sent"} 1.0' in metrics


def test_hot_prefix_never_routed_here_is_counted_not_sent(upstreams, router_factory) -> None:
    router, pa, pb, wa, _wb = _setup(upstreams, router_factory, 0.2)
    ns = Namespace(next(iter(router.state.registry.models().values())))
    keys = page_keys(PREFIX, PS)
    for _ in range(5):  # hot through another router's matches: no token ids here
        router.state.index.index.match(ns, keys, time.monotonic())
    _busy(router.state, wa, 3)
    deadline = time.monotonic() + 5
    while not router.state.warmer.outcomes["no_tokens"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert router.state.warmer.outcomes["no_tokens"] >= 1
    assert _warm_requests(pb) == [] and _warm_requests(pa) == []
    assert httpx.get(f"{router.url}/metrics").status_code == 200
