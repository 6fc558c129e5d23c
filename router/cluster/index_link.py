"""The router's link to the global index: embedded (in-process) or a standalone service.

Embedded (default): a :class:`radix_global.index.GlobalIndex` in the router process, fed by one
ZMQ KV-event subscription per registered worker (``radix_global.subscriber``). The registry calls
:meth:`worker_added` / :meth:`worker_removed`; a removed worker's entries are dropped at once.
``--index HOST:PORT`` selects the standalone gRPC index service instead (``radix_global.service``,
client ``radix_global.client``).

The policies call ``match`` synchronously on the event loop, so a remote index must never be
asked from there: the request path first awaits :meth:`RemoteIndex.prefetch_match` (grpc.aio,
bounded by ``match_timeout_s``), which leaves the answer in :class:`PrefetchedMatches`; the
policy's ``match`` then reads it. A timeout, a service error or a missing prefetch falls back to
the router's local view, an empty match (the conductor then prices the request by load and by
the prompts this router routed itself, ``router/routing/routed_prefixes.py``), counted per reason in
``router_index_match_fallbacks_total`` and in ``/admin/stats``.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from radix_global.index import GlobalIndex
from radix_global.ops import IndexRefusal, MatchResult
from radix_global.types import Namespace, PageKey, WorkerId
from router.cluster.registry import ConflictError, WorkerEntry

log = logging.getLogger("radix_global.router.index")


class EmbeddedIndex:
    """GlobalIndex + KV-event subscriptions, owned by the router's event loop."""

    remote = False

    def __init__(self, lora_extra_keys: Mapping[str, str] | None = None) -> None:
        self.index = GlobalIndex()
        self._lora_extra_keys = dict(lora_extra_keys or {})  # adapter name -> SGLang extra key
        self._subscriber: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._subscriber_error: str | None = None
        try:
            module = importlib.import_module("radix_global.subscriber")
            self._subscriber_cls: Any = module.KVEventSubscriber
        except (ImportError, AttributeError) as exc:
            self._subscriber_cls = None
            self._subscriber_error = f"radix_global.subscriber unavailable: {exc}"

    @property
    def view(self) -> GlobalIndex:
        return self.index

    async def start(self) -> None:
        if self._subscriber_cls is not None:
            # Liveness is the registry's job (heartbeats, health checks): the subscriber's own
            # timeout is never polled.
            self._subscriber = self._subscriber_cls(self.index,
                                                    lora_extra_keys=self._lora_extra_keys)
        else:
            log.warning("%s: KV events are not consumed, routing is cache-blind",
                        self._subscriber_error)

    async def stop(self) -> None:
        if self._subscriber is not None:
            await self._subscriber.close()
            self._subscriber = None

    def check(self, entry: WorkerEntry) -> None:
        """Refuse a registration the index would refuse (page size of a known namespace)."""
        ns = Namespace(entry.info.namespace)
        if ns in self.index.namespaces() and self.index.page_size(ns) != entry.info.page_size:
            raise ConflictError(f"index namespace {ns} has page size {self.index.page_size(ns)}, "
                                f"worker {entry.info.worker_id} declares {entry.info.page_size}")

    def worker_added(self, entry: WorkerEntry) -> None:
        info = entry.info
        try:
            self.index.register_namespace(Namespace(info.namespace), info.page_size)
        except IndexRefusal as exc:
            raise ConflictError(str(exc)) from exc
        if self._subscriber is not None and info.kv_events_endpoint:
            self._spawn(self._subscriber.add_worker(info, lora_extra_keys=entry.lora))

    def worker_removed(self, entry: WorkerEntry) -> None:
        if self._subscriber is not None:
            self._spawn(self._subscriber.remove_worker(WorkerId(entry.info.worker_id)))
        self.index.remove_holder(WorkerId(entry.info.worker_id))

    def heartbeat(self, worker_id: str) -> None:
        return None  # liveness is tracked by the registry; the subscriber's timeout is unused

    async def prefetch_match(self, namespace: Namespace, keys: Sequence[PageKey]) -> None:
        return None  # in-process: the policy's match is a local call already

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        return None

    def _spawn(self, coro: Any) -> None:
        """Membership callbacks are synchronous; the subscriber's are coroutines: run them in
        order on the loop, keeping a reference so they are not garbage-collected."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": "embedded"}
        stats = self.index.stats()
        out.update(stats._asdict() if hasattr(stats, "_asdict") else {"stats": str(stats)})
        if self._subscriber is not None and hasattr(self._subscriber, "stats"):
            out["subscriber"] = self._subscriber.stats()._asdict()
        elif self._subscriber_error:
            out["subscriber"] = self._subscriber_error
        return out


EMPTY_MATCH = MatchResult(0, {}, 0, frozenset())
FALLBACK_REASONS = ("timeout", "error", "not_prefetched")


class PrefetchedMatches:
    """Match answers fetched ahead of the policy's synchronous ``match``: an LRU of
    ``max_entries`` keyed by (namespace, keys), each valid ``ttl_s`` (a retry of the same
    request re-reads it). Pure: time is passed in."""

    def __init__(self, max_entries: int = 1024, ttl_s: float = 30.0) -> None:
        if max_entries < 1 or ttl_s <= 0:
            raise ValueError("need max_entries >= 1 and ttl_s > 0")
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._entries: collections.OrderedDict[tuple[str, tuple[int, ...]],
                                               tuple[float, MatchResult]] = \
            collections.OrderedDict()

    def put(self, namespace: str, keys: Sequence[PageKey], result: MatchResult, now: float
            ) -> None:
        key = (namespace, tuple(keys))
        self._entries[key] = (now, result)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, namespace: str, keys: Sequence[PageKey], now: float) -> MatchResult | None:
        hit = self._entries.get((namespace, tuple(keys)))
        if hit is None or now - hit[0] > self.ttl_s:
            return None
        return hit[1]

    def __len__(self) -> int:
        return len(self._entries)


class _PrefetchedView:
    """The index as the policies see it in service mode: ``match`` answers from the prefetched
    results and never touches the network; other queries (off the request path: hot prefixes
    for warming) go to the blocking client."""

    def __init__(self, owner: RemoteIndex) -> None:
        self._owner = owner

    def match(self, namespace: Namespace, keys: Sequence[PageKey], now: float | None = None
              ) -> MatchResult:
        got = self._owner.prefetched.get(namespace, keys, time.monotonic())
        if got is not None:
            self._owner.served_prefetched += 1
            return got
        failed = self._owner.failed_last.pop((namespace, tuple(keys)), None)
        if failed is None:  # a prefetch failure was counted already
            self._owner.count_fallback("not_prefetched")
        return EMPTY_MATCH

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner.client, name)


class RemoteIndex:
    """The standalone index service (``radix-global index serve``) through its gRPC clients.

    The service subscribes to the workers' KV events itself; the router registers and deregisters
    workers there and forwards their liveness as heartbeats (blocking calls, off the request
    path). Per request, :meth:`prefetch_match` asks the service through ``grpc.aio`` with a
    ``match_timeout_s`` bound; the policy reads the answer through :attr:`view`.
    """

    remote = True

    def __init__(self, target: str, admin_token: str | None = None,
                 match_timeout_s: float = 0.1) -> None:
        from radix_global.client import IndexClient

        if match_timeout_s <= 0:
            raise ValueError("match_timeout_s must be > 0")
        self.target = target.removeprefix("grpc://").removeprefix("http://")
        self.client = IndexClient(self.target, admin_token=admin_token)
        self._admin_token = admin_token
        self.match_timeout_s = match_timeout_s
        self._aclient: Any = None  # AsyncIndexClient, made on the serving loop (start)
        self.prefetched = PrefetchedMatches()
        self.failed_last: collections.OrderedDict[tuple[str, tuple[int, ...]], str] = \
            collections.OrderedDict()
        self.served_prefetched = 0
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self._metric: Counter | None = None
        self._view = _PrefetchedView(self)

    @property
    def view(self) -> Any:
        return self._view

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        self._metric = Counter(
            "router_index_match_fallbacks", "Remote index matches answered by the local view "
            "instead (timeout, error, not_prefetched)", ["reason"], registry=registry)
        for reason in FALLBACK_REASONS:
            self._metric.labels(reason)

    def count_fallback(self, reason: str) -> None:
        self.fallbacks[reason] += 1
        if self._metric is not None:
            self._metric.labels(reason).inc()

    async def start(self) -> None:
        await self._async_client()

    async def _async_client(self) -> Any:
        if self._aclient is None:  # grpc.aio binds to the loop it is created on
            from radix_global.client import AsyncIndexClient

            self._aclient = AsyncIndexClient(self.target, admin_token=self._admin_token,
                                             timeout_s=self.match_timeout_s)
        return self._aclient

    async def prefetch_match(self, namespace: Namespace, keys: Sequence[PageKey]) -> None:
        """Ask the service for ``keys`` without blocking the loop; on timeout or error the
        policy gets the local view (counted). Never raises (a refusal such as an unknown
        namespace is an answer the policy handles: cache-blind)."""
        if not keys:
            return
        client = await self._async_client()
        try:
            result = await asyncio.wait_for(client.match(namespace, keys),
                                            self.match_timeout_s * 1.5)
        except IndexRefusal:
            self._failed(namespace, keys, "error")
            return
        except TimeoutError:
            self._failed(namespace, keys, "timeout")
            return
        except Exception as exc:
            code = getattr(exc, "code", None)
            reason = "timeout" if getattr(code, "name", "") == "DEADLINE_EXCEEDED" else "error"
            log.debug("index service match failed: %r", exc)
            self._failed(namespace, keys, reason)
            return
        self.prefetched.put(namespace, keys, result, time.monotonic())

    def _failed(self, namespace: str, keys: Sequence[PageKey], reason: str) -> None:
        self.count_fallback(reason)
        self.failed_last[(namespace, tuple(keys))] = reason
        while len(self.failed_last) > 256:
            self.failed_last.popitem(last=False)

    async def stop(self) -> None:
        if self._aclient is not None:
            await self._aclient.close()
            self._aclient = None
        self.client.close()

    def check(self, entry: WorkerEntry) -> None:
        return None  # the service refuses a page-size conflict itself (worker_added raises)

    def worker_added(self, entry: WorkerEntry) -> None:
        try:
            self.client.register(entry.info)
        except IndexRefusal as exc:
            raise ConflictError(str(exc)) from exc

    def worker_removed(self, entry: WorkerEntry) -> None:
        try:
            self.client.deregister(WorkerId(entry.info.worker_id))
        except Exception as exc:  # unknown there already, or the service is down: logged only
            log.warning("index service deregister of %s failed: %r", entry.info.worker_id, exc)

    def heartbeat(self, worker_id: str) -> None:
        try:
            self.client.heartbeat(WorkerId(worker_id))
        except Exception as exc:
            log.warning("index service heartbeat of %s failed: %r", worker_id, exc)

    def stats(self) -> dict[str, Any]:
        local = {"match_timeout_s": self.match_timeout_s,
                 "matches_prefetched": self.served_prefetched,
                 "match_fallbacks": dict(self.fallbacks)}
        try:
            return {"mode": "service", "target": self.target, **local, **self.client.stats()}
        except Exception as exc:
            return {"mode": "service", "target": self.target, **local, "error": repr(exc)}


ClusterIndex = EmbeddedIndex | RemoteIndex


def open_index(index_url: str | None, admin_token: str | None = None,
               match_timeout_s: float = 0.1,
               lora_extra_keys: Mapping[str, str] | None = None) -> ClusterIndex:
    """Embedded index by default; ``index_url`` (host:port of ``radix-global index serve``)
    selects the standalone service. ``lora_extra_keys``: adapter name -> SGLang extra key, for
    re-keying LoRA stores (embedded index only)."""
    if index_url is None:
        return EmbeddedIndex(lora_extra_keys)
    return RemoteIndex(index_url, admin_token, match_timeout_s)
