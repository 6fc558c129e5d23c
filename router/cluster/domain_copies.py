"""Copies of hot prefixes in other fault domains: the router's side (``docs/interfaces.md``,
"Where hosts are", "Copies across fault domains").

Every ``interval_s`` (the leader router only, when several share a view) a round asks the index
for its hot prefixes, the :class:`CopyPlanner` for orders, and turns each order into the storage
keys of the prefix (from the token ids the router remembers). The orders wait for the target
worker's pool backend to ask for them (``GET /admin/pool-copies``); the backend copies the pages
into its own segment and publishes them, so the index learns the copy as any store.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from radix_global.index import GlobalIndex
from radix_global.keys import page_digests
from radix_global.pool_ids import is_segment
from radix_global.registration import WorkerInfo
from radix_global.types import Namespace, PageKey, PoolId, WorkerId
from router.cluster.copy_planner import (
    Copy,
    CopyConfig,
    CopyOrder,
    CopyOutcome,
    CopyPlanner,
    Target,
    run_holders,
)
from router.cluster.index_link import ClusterIndex
from router.cluster.places import Places
from router.cluster.prefix_tokens import PrefixTokens
from router.cluster.registry import WorkerRegistry

log = logging.getLogger(__name__)
MAX_WAITING_PER_POOL = 256  # orders a backend has not fetched yet; older ones are dropped


class DomainCopies:
    def __init__(self, config: CopyConfig, index: ClusterIndex, registry: WorkerRegistry,
                 places: Places, prefixes: PrefixTokens, top_k: int = 16,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.index, self.registry = config, index, registry
        self.places, self.prefixes, self.top_k, self.clock = places, prefixes, top_k, clock
        self.planner = CopyPlanner(config)
        self.outcomes: collections.Counter[str] = collections.Counter()
        self._waiting: dict[str, collections.deque[dict[str, Any]]] = {}
        self._metric: Counter | None = None
        self._task: asyncio.Task[None] | None = None
        self.held = 0  # counted copies whose target held their whole run at the last round
        self.capacity_pages: int | None = None  # the segments' registered, at the last round
        self.leads: Callable[[], bool] = lambda: True

    @property
    def enabled(self) -> bool:
        return self.config.interval_s > 0

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        self._metric = Counter("radix_global_copy_orders",
                               "Copies of hot prefixes in other fault domains, by outcome",
                               ["outcome"], registry=registry)

    def take(self, pool_id: str) -> list[dict[str, Any]]:
        """The orders waiting for the worker whose pool is ``pool_id``, handed out once."""
        waiting = self._waiting.pop(pool_id, None)
        return list(waiting) if waiting else []

    def stats(self) -> dict[str, Any]:
        return {"waiting": sum(len(q) for q in self._waiting.values()),
                "pages": self.planner.pages(), "held": self.held,
                "budget_pages": self.planner.limit(self.capacity_pages),
                "capacity_pages": self.capacity_pages,
                "outcomes": dict(self.outcomes)}

    def run_once(self) -> list[CopyOrder]:
        """One round (on the event loop: the embedded index is owned by it)."""
        now = self.clock()
        view = self.index.view
        if not isinstance(view, GlobalIndex):  # a remote index: copies are off (start says so)
            return []
        segments = [e for e in self.registry.all() if e.info.pool_id and is_segment(e.info.pool_id)]
        targets = [Target(WorkerId(e.info.worker_id), PoolId(e.info.pool_id or ""),
                          self.places.domain_of(WorkerId(e.info.worker_id)) or "")
                   for e in segments if not e.draining]
        self.capacity_pages = capacity_pages(e.info for e in segments)
        namespaces = set(self.registry.models().values())

        made = {key: c.namespace in namespaces
                and c.target in run_holders(view, c.namespace, now)(c.keys)
                for key, c in self.planner.copies.items()}

        def holds(c: Copy) -> bool:
            return made[(c.namespace, c.keys[-1], c.target)]

        pools = {e.info.pool_id for e in self.registry.all()}
        self.planner.settle(holds, lambda holder: holder in pools, now)
        self.held = sum(map(holds, self.planner.copies.values()))
        for pool in [p for p in self._waiting if p not in pools]:  # its worker left
            del self._waiting[pool]
        done: list[CopyOrder] = []
        for namespace in sorted(namespaces):
            ns = Namespace(namespace)
            hot = self.index.hot_prefixes(ns, self.top_k, now)
            orders, outcomes = self.planner.plan(
                ns, now, hot, run_holders(view, ns, now), self.places.domain_of, targets,
                partial(self._known, ns), self.capacity_pages)
            for order in orders:
                remembered = self._tokens(ns, order.keys)
                if remembered is None:
                    continue
                ids, page_size, salt = remembered
                digests = page_digests(ids, page_size, cache_salt=salt)
                queue = self._waiting.setdefault(
                    order.target.pool_id, collections.deque(maxlen=MAX_WAITING_PER_POOL))
                queue.append({"namespace": ns, "keys": [d.hex() for d in digests]})
                done.append(order)
            for outcome, n in outcomes.items():
                self._count(outcome, n)
        return done

    def _known(self, namespace: Namespace, keys: tuple[PageKey, ...]) -> bool:
        return self._tokens(namespace, keys) is not None

    def _tokens(self, namespace: Namespace, keys: tuple[PageKey, ...]
                ) -> tuple[list[int], int, str | None] | None:
        """The prefix's token ids, page size and salt; None when unknown or an adapter's (its
        storage keys carry the adapter's extra key, which an order does not)."""
        hit = self.prefixes.tokens(namespace, keys)
        page_size = self.registry.page_size(namespace)
        if hit is None or hit.scope.lora is not None or not page_size:
            return None
        return hit.ids, page_size, hit.scope.cache_salt

    def _count(self, outcome: CopyOutcome, n: int = 1) -> None:
        self.outcomes[outcome.value] += n
        if self._metric is not None:
            self._metric.labels(outcome.value).inc(n)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            if not self.leads():
                continue
            try:
                self.run_once()
            except Exception:  # a bug in one round must not stop the copies
                log.exception("copy round failed")

    def start(self) -> None:
        if self.enabled and self._task is None and not self.index.remote:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        elif self.enabled and self.index.remote:
            log.warning("copies across fault domains need the embedded index; off")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def capacity_pages(workers: Iterable[WorkerInfo]) -> int | None:
    """The pages the segments of ``workers`` hold, from what they registered
    (``pool_capacity_bytes`` over a page's KV bytes); None when none of them says."""
    known = [w.pool_capacity_bytes // (w.kv_bytes_per_token * w.page_size) for w in workers
             if w.pool_capacity_bytes and w.kv_bytes_per_token]
    return sum(known) if known else None
