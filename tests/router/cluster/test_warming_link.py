"""The warmer's collaborators are typed (router/cluster/warming.py): it asks the index link's own
``hot_prefixes`` and ``direct_view`` (router/cluster/index_link.py ``EmbeddedIndex``), not the
index's internals through ``getattr`` on a whole ``RouterState``.

Negative control: a link whose ``hot_prefixes`` names no hot prefix gets no warm request, although
its in-process index (what the warmer used to read directly) holds the same hot, busy prefix."""

from __future__ import annotations

import asyncio
import json

import httpx

from radix_global.keys import page_keys
from radix_global.ops import HotPrefix, StorePages
from radix_global.registration import WorkerInfo
from radix_global.types import Location, Namespace, Tier, WorkerId
from router.cluster.index_link import EmbeddedIndex
from router.cluster.prefix_tokens import SHARED
from router.cluster.registry import Source, WorkerRegistry
from router.cluster.replication import WarmConfig
from router.cluster.warming import HotPrefixWarmer
from router.routing.contract import Slot

PS = 4
NS = Namespace("tiny@1")
PREFIX = list(range(10, 42))  # 8 pages
KEYS = page_keys(PREFIX, PS)
NOW = 100.0


class NothingHot(EmbeddedIndex):
    """The embedded link answering that nothing is hot."""

    def hot_prefixes(self, namespace: Namespace, top_k: int, now: float) -> list[HotPrefix]:
        return []


def _registry() -> WorkerRegistry:
    registry = WorkerRegistry()
    for wid in ("a", "b"):
        registry.add(WorkerInfo(worker_id=wid, url=f"http://{wid}.test", model="tiny",
                                namespace=NS, page_size=PS), Source.REGISTERED, 0.0)
    return registry


def _link(link: EmbeddedIndex) -> EmbeddedIndex:
    """The prefix is held by worker ``a`` only, and hot (matched by earlier requests)."""
    link.index.register_namespace(NS, PS)
    link.index.apply(StorePages(NS, Location(WorkerId("a"), 0, Tier.GPU), None, KEYS))
    for t in range(5):
        link.index.match(NS, KEYS, NOW - 5 + t)
    return link


async def _warm(link: EmbeddedIndex) -> tuple[list[tuple[str, dict]], dict[str, int]]:
    sent: list[tuple[str, dict]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append((str(request.url), json.loads(request.content)))
        return httpx.Response(200, json={"text": "x"})

    def outstanding(slot: Slot) -> int:
        return 3 if slot[0] == "a" else 0  # the only holder is busy, the other worker idle

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        warmer = HotPrefixWarmer(link, _registry(), client, outstanding,
                                 config=WarmConfig(interval_s=1.0, min_hit_rate=0.01),
                                 clock=lambda: NOW)
        warmer.remember(NS, KEYS, PREFIX, PS, prefix_tokens=len(PREFIX), scope=SHARED)
        await warmer.run_once()
        await asyncio.gather(*warmer._in_flight)
    return sent, dict(warmer.outcomes)


def test_warmer_plans_from_the_links_hot_prefixes() -> None:
    assert [h.keys for h in _link(EmbeddedIndex()).hot_prefixes(NS, 4, NOW)] == [tuple(KEYS)]
    sent, outcomes = asyncio.run(_warm(_link(EmbeddedIndex())))
    assert [url for url, _ in sent] == ["http://b.test/generate"]
    body = sent[0][1]
    assert body["input_ids"] == PREFIX and body["sampling_params"]["max_new_tokens"] == 1
    assert outcomes == {"sent": 1}


def test_negative_control_nothing_hot_per_the_link_nothing_warmed() -> None:
    link = _link(NothingHot())
    assert link.index.hot_prefixes(NS, 4, NOW)  # the index itself still holds a hot prefix
    sent, outcomes = asyncio.run(_warm(link))
    assert sent == [] and outcomes == {}
