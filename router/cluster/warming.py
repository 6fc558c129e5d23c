"""Executes the hot-prefix warming that :class:`router.cluster.replication.WarmupPlanner` plans.

Every ``interval_s`` the warmer asks the index for each served namespace's hot prefixes, lets the
planner pick (prefix, lightly loaded slot) pairs within its page budget (a token bucket: the
bounded rate), and sends each chosen slot a prefix-only ``/generate`` with ``max_new_tokens=1``
(SGLang engines only: the request carries token ids). The engine's KV events then show the new
copy to the index, and routing can use it.

The index knows page keys, not tokens, so the router remembers the token ids of prompts it routed
that reused a cached prefix (a repeated prefix is what can become hot): :class:`PrefixTokens`, an
LRU bounded in pages, answers "the token ids of this chain of page keys" for any leading run of a
remembered prompt. A hot prefix the router never routed (another router's traffic) cannot be
warmed from here and is counted as ``no_tokens``.

Outcomes are counted in ``router_warm_actions_total{outcome}``: ``sent`` (the engine answered),
``failed`` (error or timeout), ``no_tokens``, ``unsupported`` (not an SGLang engine), ``busy``
(``max_in_flight`` warm requests already running).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter

from radix_global.types import Namespace, PageKey
from router.cluster.index_link import ClusterIndex
from router.cluster.registry import WorkerRegistry
from router.cluster.replication import WarmAction, WarmConfig, WarmupPlanner
from router.cluster.slots import worker_states
from router.routing.contract import Slot, WorkerState

log = logging.getLogger("radix_global.router.cluster.warming")

OUTCOMES = ("sent", "failed", "no_tokens", "unsupported", "busy")


class PrefixTokens:
    """Token ids of routed prompts, findable by any of their page keys. Pure; bounded LRU.

    Page keys are chained digests, so a key names its whole prefix: the ids of ``keys`` are the
    first ``len(keys) * page_size`` ids of a remembered prompt containing ``keys[-1]`` at
    position ``len(keys) - 1``.
    """

    def __init__(self, max_pages: int = 200_000) -> None:
        if max_pages < 1:
            raise ValueError("max_pages must be >= 1")
        self.max_pages = max_pages
        self._prompts: collections.OrderedDict[int, tuple[str, tuple[PageKey, ...],
                                                          list[int], int]] = \
            collections.OrderedDict()
        self._where: dict[tuple[str, PageKey], tuple[int, int]] = {}  # -> (prompt id, pages)
        self._pages = 0
        self._next = 0

    def remember(self, namespace: str, keys: Sequence[PageKey], ids: Sequence[int],
                 page_size: int) -> None:
        pages = min(len(keys), len(ids) // page_size) if page_size > 0 else 0
        if pages == 0 or pages > self.max_pages:
            return
        last = self._where.get((namespace, keys[pages - 1]))
        if last is not None and last[1] == pages:  # already known: refresh its prompt
            self._prompts.move_to_end(last[0])
            return
        pid = self._next
        self._next += 1
        own = tuple(keys[:pages])
        self._prompts[pid] = (namespace, own, list(ids[: pages * page_size]), page_size)
        for i, key in enumerate(own):
            self._where[(namespace, key)] = (pid, i + 1)
        self._pages += pages
        while self._pages > self.max_pages:
            self._evict()

    def tokens(self, namespace: str, keys: Sequence[PageKey]) -> list[int] | None:
        if not keys:
            return None
        hit = self._where.get((namespace, keys[-1]))
        if hit is None or hit[1] != len(keys):
            return None
        _, _, ids, page_size = self._prompts[hit[0]]
        self._prompts.move_to_end(hit[0])
        return ids[: len(keys) * page_size]

    def _evict(self) -> None:
        pid, (namespace, keys, _, _) = self._prompts.popitem(last=False)
        self._pages -= len(keys)
        for key in keys:
            if self._where.get((namespace, key), (None,))[0] == pid:
                del self._where[(namespace, key)]

    def __len__(self) -> int:
        return len(self._prompts)


class HotPrefixWarmer:
    """Plans and sends warm requests; off unless ``interval_s > 0``.

    ``index``: the index link (its ``hot_prefixes`` and ``direct_view``; a remote link's blocking
    queries run in a worker thread); ``registry``: the served models and their workers;
    ``client``: the HTTP client warm requests go through; ``outstanding``: a slot's requests in
    flight (the cost model's ``outstanding``), which says which holders are busy."""

    def __init__(self, index: ClusterIndex, registry: WorkerRegistry, client: httpx.AsyncClient,
                 outstanding: Callable[[Slot], int], interval_s: float = 0.0,
                 config: WarmConfig | None = None, top_k: int = 16, max_in_flight: int = 2,
                 timeout_s: float = 60.0, max_pages: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.index, self.registry, self.client = index, registry, client
        self.outstanding = outstanding
        self.interval_s = interval_s
        self.planner = WarmupPlanner(config)
        self.prefixes = PrefixTokens(max_pages)
        self.top_k, self.max_in_flight, self.timeout_s = top_k, max_in_flight, timeout_s
        self.clock = clock
        self.outcomes: collections.Counter[str] = collections.Counter()
        self._metric: Counter | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._sent = 0
        self._rid_prefix = f"{id(self):x}"

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        self._metric = Counter("router_warm_actions", "Hot-prefix warm actions by outcome",
                               ["outcome"], registry=registry)
        for outcome in OUTCOMES:
            self._metric.labels(outcome)

    def remember(self, namespace: str, keys: Sequence[PageKey], ids: Sequence[int],
                 page_size: int, prefix_tokens: int) -> None:
        """Called per routed request: keep the ids of prompts that reused a cached prefix of at
        least the planner's ``min_pages``."""
        if self.enabled and prefix_tokens >= self.planner.config.min_pages * page_size:
            self.prefixes.remember(namespace, keys, ids, page_size)

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        if self._metric is not None:
            self._metric.labels(outcome).inc()

    async def run_once(self) -> list[WarmAction]:
        """One planning round; returns the actions started (their requests run as tasks)."""
        started: list[WarmAction] = []
        now = self.clock()
        for model, namespace in sorted(self.registry.models().items()):
            entries = {e.info.worker_id: e for e in self.registry.for_model(model)}
            slots = worker_states(entries.values())
            loads = {w.slot: self.outstanding(w.slot) for w in slots}
            try:
                actions = await self._plan(Namespace(namespace), slots, loads, now)
            except Exception as exc:  # e.g. IndexRefusal, or a remote index that is down
                log.info("warming plan for %s failed: %r", namespace, exc)
                continue
            for action in actions:
                entry = entries.get(action.worker_id)
                if entry is None:
                    continue
                if entry.info.engine != "sglang":
                    self._count("unsupported")
                    continue
                ids = self.prefixes.tokens(namespace, action.keys)
                if ids is None:
                    self._count("no_tokens")
                    continue
                if len(self._in_flight) >= self.max_in_flight:
                    self._count("busy")
                    continue
                task = asyncio.get_running_loop().create_task(
                    self._send(entry.info.url, entry.info.dp_size, action, ids))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
                started.append(action)
        return started

    async def _plan(self, namespace: Namespace, slots: list[WorkerState],
                    loads: Mapping[Slot, int], now: float) -> list[WarmAction]:
        index = self.index

        def plan() -> list[WarmAction]:
            hot = index.hot_prefixes(namespace, self.top_k, now)
            return self.planner.plan(namespace, hot, slots, loads, index.direct_view, now)

        if index.remote:  # blocking gRPC calls: off the event loop
            return await asyncio.to_thread(plan)
        return plan()  # the in-process index is owned by the loop: asked on it

    async def _send(self, url: str, dp_size: int, action: WarmAction, ids: list[int]) -> None:
        self._sent += 1
        body: dict[str, Any] = {"input_ids": ids, "rid": f"warm-{self._rid_prefix}-{self._sent}",
                                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        if dp_size > 1:
            body["routed_dp_rank"] = action.dp_rank
        try:
            resp = await self.client.post(f"{url}/generate", json=body, timeout=self.timeout_s)
            ok = resp.status_code == 200
        except httpx.HTTPError as exc:
            log.info("warm request to %s failed: %r", url, exc)
            ok = False
        self._count("sent" if ok else "failed")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.run_once()
            except Exception:  # a bug in one round must not stop warming
                log.exception("warming round failed")

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._in_flight) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None
