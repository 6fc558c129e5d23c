"""Executes the hot-prefix warming that :class:`router.cluster.replication.WarmupPlanner` plans.

Every ``interval_s`` the warmer asks the index for each served namespace's hot prefixes, lets the
planner pick (prefix, lightly loaded slot) pairs within its page budget (a token bucket: the
bounded rate), and sends each chosen slot a prefix-only ``/generate`` with ``max_new_tokens=1``
(SGLang engines only: the request carries token ids). The engine's KV events then show the new
copy to the index, and routing can use it.

The index knows page keys, not tokens, so the router remembers the token ids of prompts it routed
that reused a cached prefix (a repeated prefix is what can become hot): :class:`PrefixTokens`, an
LRU bounded in pages, answers "the token ids of this chain of page keys, and the namespace (salt,
adapter) they were keyed in" for any leading run of a remembered prompt; the warm request carries
that namespace, so an isolated tenant's prefix is warmed in the tenant's namespace, never in the
shared one. A hot prefix the router never routed (another router's traffic) cannot be
warmed from here and is counted as ``no_tokens``.

Outcomes are counted in ``radix_global_warm_actions_total{outcome}``: ``sent`` (the engine
answered), ``failed`` (error or timeout), ``no_tokens``, ``unsupported`` (not an SGLang engine),
``busy`` (``max_in_flight`` warm requests already running).

A worker that joins is pre-warmed once (``join_pages`` > 0, ``docs/interfaces.md``,
"The router's index snapshot"): the hottest prefixes of its namespace it does not hold, within a
page and a time budget; pages by outcome in ``radix_global_join_warm_pages_total{outcome}``
(``sent``, ``failed``, ``no_tokens``, ``budget``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
from prometheus_client import CollectorRegistry, Counter

from radix_global.ops import HolderMatch, HotPrefix
from radix_global.options import opt
from radix_global.types import Namespace, PageKey
from router.cluster.index_link import ClusterIndex
from router.cluster.prefix_tokens import PrefixTokens, Remembered, WarmScope
from router.cluster.registry import WorkerEntry, WorkerRegistry
from router.cluster.replication import WarmAction, WarmConfig, WarmupPlanner
from router.cluster.slots import worker_states
from router.routing.contract import Slot, WorkerState

log = logging.getLogger("radix_global.router.cluster.warming")

OUTCOMES = ("sent", "failed", "no_tokens", "unsupported", "busy")
JOIN_OUTCOMES = ("sent", "failed", "no_tokens", "budget")
_NONE = HolderMatch(0, 0, 0)


@dataclass(frozen=True)
class JoinWarmConfig:
    """Join warming: a joining worker gets its namespace's hottest prefixes.

    Those it does not hold, within a page and a time budget (docs/interfaces.md,
    "The router's index snapshot"; ``RouterConfig.join_warm``, options ``join_warm_*``)."""

    pages: Annotated[int, opt(
        "pages of hot prefixes sent to a joining worker; 0 = off", ge=0)] = 0
    timeout_s: Annotated[float, opt("time budget of a joining worker's pre-warming", gt=0)] = 60.0

    def __post_init__(self) -> None:
        if self.pages < 0 or self.timeout_s <= 0:
            raise ValueError("join_warm_pages must be >= 0 and join_warm_timeout_s > 0")


class HotPrefixWarmer:
    """Plans and sends warm requests; off unless ``interval_s > 0``.

    ``index``: the index link (its ``hot_prefixes`` and ``direct_view``; a remote link's blocking
    queries run in a worker thread); ``registry``: the served models and their workers;
    ``client``: the HTTP client warm requests go through; ``outstanding``: a slot's requests in
    flight (the cost model's ``outstanding``), which says which holders are busy."""

    def __init__(self, index: ClusterIndex, registry: WorkerRegistry, client: httpx.AsyncClient,
                 outstanding: Callable[[Slot], int], config: WarmConfig | None = None,
                 join: JoinWarmConfig | None = None, top_k: int = 16, max_in_flight: int = 2,
                 timeout_s: float = 60.0, max_pages: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.index, self.registry, self.client = index, registry, client
        self.outstanding = outstanding
        self.planner = WarmupPlanner(config)
        self.interval_s = self.planner.config.interval_s
        join = join or JoinWarmConfig()
        self.prefixes = PrefixTokens(max_pages)
        self.top_k, self.max_in_flight, self.timeout_s = top_k, max_in_flight, timeout_s
        self.clock = clock
        self.join_pages, self.join_timeout_s = join.pages, join.timeout_s
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.join_outcomes: collections.Counter[str] = collections.Counter()  # outcome -> pages
        self._metric: Counter | None = None
        self._join_metric: Counter | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._sent = 0
        self._rid_prefix = f"{id(self):x}"
        # whether this router runs the cluster's warming (the leader, when several share a
        # view: docs/interfaces.md, "Several routers, one view"); set by the router
        self.leads: Callable[[], bool] = lambda: True
        # another part needs the prompts too (copies across fault domains)
        self.keep_prompts = False

    @property
    def enabled(self) -> bool:
        """Warming of either kind is on, or another part needs them: routed prompts' token ids
        are remembered."""
        return self.interval_s > 0 or self.join_pages > 0 or self.keep_prompts

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        self._metric = Counter("radix_global_warm_actions", "Hot-prefix warm actions by outcome",
                               ["outcome"], registry=registry)
        for outcome in OUTCOMES:
            self._metric.labels(outcome)
        self._join_metric = Counter("radix_global_join_warm_pages",
                                    "Pages of hot prefixes sent to joining workers, by outcome",
                                    ["outcome"], registry=registry)
        for outcome in JOIN_OUTCOMES:
            self._join_metric.labels(outcome)

    def remember(self, namespace: str, keys: Sequence[PageKey], ids: Sequence[int],
                 page_size: int, prefix_tokens: int, scope: WarmScope) -> None:
        """Called per routed request: keep the ids of prompts that reused a cached prefix of at
        least the planner's ``min_pages``, with the scope (salt, adapter) ``keys`` were keyed
        in."""
        if self.enabled and prefix_tokens >= self.planner.config.min_pages * page_size:
            self.prefixes.remember(namespace, keys, ids, page_size, scope)

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
                prefix = self.prefixes.tokens(namespace, action.keys)
                if prefix is None:
                    self._count("no_tokens")
                    continue
                if len(self._in_flight) >= self.max_in_flight:
                    self._count("busy")
                    continue
                task = asyncio.get_running_loop().create_task(
                    self._send_action(entry.info.url, entry.info.dp_size, action, prefix))
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

    async def _send(self, url: str, dp_size: int, dp_rank: int, prefix: Remembered,
                    timeout_s: float | None = None) -> bool:
        """One prefix-only request (``max_new_tokens=1``) in the prefix's own namespace (its
        salt and adapter: its pages land where its requests will look); True when the engine
        answered 200."""
        self._sent += 1
        body: dict[str, Any] = {"input_ids": prefix.ids,
                                "rid": f"warm-{self._rid_prefix}-{self._sent}",
                                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        if prefix.scope.cache_salt is not None:
            body["cache_salt"] = prefix.scope.cache_salt
        if prefix.scope.lora is not None:
            body["lora_path"] = prefix.scope.lora
        if dp_size > 1:
            body["routed_dp_rank"] = dp_rank
        try:
            resp = await self.client.post(f"{url}/generate", json=body,
                                          timeout=timeout_s or self.timeout_s)
            return resp.status_code == 200
        except httpx.HTTPError as exc:
            log.info("warm request to %s failed: %r", url, exc)
            return False

    async def _send_action(self, url: str, dp_size: int, action: WarmAction,
                           prefix: Remembered) -> None:
        ok = await self._send(url, dp_size, action.dp_rank, prefix)
        self._count("sent" if ok else "failed")

    # ---- a worker joining a warm cluster (docs/interfaces.md, "The router's index snapshot") -
    def joined(self, entry: WorkerEntry) -> None:
        """Pre-warm a worker that just joined, in the background (``join_pages`` > 0, SGLang
        engines, on the server loop)."""
        if self.join_pages <= 0 or entry.info.engine != "sglang" or not self.leads():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # registered outside the server loop (tests): nothing to run on
            return
        task = loop.create_task(self.warm_joined(entry))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def warm_joined(self, entry: WorkerEntry) -> int:
        """Send the joined worker its namespace's hottest prefixes, hottest first, one at a
        time, within ``join_pages`` pages and ``join_timeout_s`` seconds; skip what it holds
        already (a worker coming back to a restored index) and what a longer prefix sent
        covers. Its engine loads them from the pool where the pool holds them, and computes
        the rest while it has little else to do. Returns the pages sent."""
        info, ns = entry.info, Namespace(entry.info.namespace)
        deadline = self.clock() + self.join_timeout_s
        index = self.index

        def plan() -> list[tuple[HotPrefix, int]]:
            hot = index.hot_prefixes(ns, self.top_k, self.clock())
            view = index.direct_view
            return [(h, view.match(ns, list(h.keys), self.clock()).matched.get(
                (entry.worker_id, 0), _NONE).host) for h in hot]

        try:
            hot = await asyncio.to_thread(plan) if index.remote else plan()
        except Exception as exc:  # an unknown namespace (nothing hot yet), a remote index down
            log.info("join warming of %s: no hot prefixes (%r)", info.worker_id, exc)
            return 0
        wanted = [h for h in hot if h[1] < h[0].pages]
        covered = {h.keys[:i] for h, _ in wanted for i in range(1, h.pages)}  # by longer ones
        pages = 0
        for prefix, _ in sorted(wanted, key=lambda h: -h[0].hit_rate):
            if prefix.keys in covered:
                continue
            known = self.prefixes.tokens(ns, prefix.keys)
            if known is None:
                outcome = "no_tokens"
            elif pages + prefix.pages > self.join_pages or self.clock() >= deadline:
                outcome = "budget"
            elif await self._send(info.url, info.dp_size, 0, known,
                                  min(self.timeout_s, deadline - self.clock())):
                outcome, pages = "sent", pages + prefix.pages
            else:
                outcome = "failed"
            self._count_join(outcome, prefix.pages)
        log.info("worker %s pre-warmed with %d pages of hot prefixes", info.worker_id, pages)
        return pages

    def _count_join(self, outcome: str, pages: int) -> None:
        self.join_outcomes[outcome] += pages
        if self._join_metric is not None:
            self._join_metric.labels(outcome).inc(pages)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not self.leads():
                continue
            try:
                await self.run_once()
            except Exception:  # a bug in one round must not stop warming
                log.exception("warming round failed")

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._in_flight) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None
