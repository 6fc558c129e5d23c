"""The router's link to the standalone index service (``--index HOST:PORT``: ``radix-global index
serve``, ``radix_global.service``) through its gRPC clients (``radix_global.client``); the
embedded link and :func:`router.cluster.index_link.open_index` are in ``index_link.py``.

The policies call ``match`` synchronously on the event loop, so the service must never be asked
from there: the request path first awaits :meth:`RemoteIndex.prefetch_match` (grpc.aio, bounded
by ``match_timeout_s``), which leaves the answer in :class:`PrefetchedMatches`; the policy's
``match`` then reads it. A timeout, a service error or a missing prefetch falls back to the
router's local view, an empty match (the conductor then prices the request by load and by the
prompts this router routed itself, ``router/routing/routed_prefixes.py``), counted per reason in
``radix_global_index_match_fallbacks_total`` and in ``/admin/stats``. Queries off the request path
(warming's hot prefixes and holder matches) use the blocking client, from a worker thread.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from radix_global.ops import HotPrefix, IndexRefusal, MatchResult
from radix_global.pool_ids import is_segment
from radix_global.types import Namespace, PageKey, PoolId, WorkerId
from router.cluster.registry import ConflictError, WorkerEntry
from router.routing.contract import IndexView

log = logging.getLogger("radix_global.router.index")


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
    results and never touches the network (queries off the request path go through
    :meth:`RemoteIndex.hot_prefixes` and :attr:`RemoteIndex.direct_view`)."""

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


class RemoteIndex:
    """The standalone index service (``radix-global index serve``) through its gRPC clients.

    The service subscribes to the workers' KV events itself; the router registers and deregisters
    workers there and forwards their liveness as heartbeats (blocking calls, off the request
    path). Per request, :meth:`prefetch_match` asks the service through ``grpc.aio`` with a
    ``match_timeout_s`` bound; the policy reads the answer through :attr:`view`.
    """

    remote = True  # its queries block (gRPC): the request path prefetches, warming uses a thread

    def __init__(self, target: str, admin_token: str | None = None,
                 match_timeout_s: float = 0.1) -> None:
        from radix_global.client import IndexClient

        if match_timeout_s <= 0:
            raise ValueError("match_timeout_s must be > 0")
        self.target = target.removeprefix("grpc://").removeprefix("http://")
        self.client = IndexClient(self.target, admin_token=admin_token)
        self._admin_token = admin_token
        self._warned_auth = False
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
    def view(self) -> IndexView:
        """What the policies read: prefetched answers only, never the network."""
        return self._view

    @property
    def direct_view(self) -> IndexView:
        """The service answering ``match`` itself (the blocking client), for queries off the
        request path such as warming's holder check: call it off the event loop."""
        return self.client

    def hot_prefixes(self, namespace: Namespace, top_k: int, now: float) -> list[HotPrefix]:
        """The service's ``top_k`` hottest prefixes of ``namespace``: a blocking gRPC call, so
        off the event loop. ``now`` (the router's clock) is not sent: the service decays hits
        by its own clock. Raises ``IndexRefusal`` (e.g. unknown namespace) or a service error."""
        return self.client.hot_prefixes(namespace, top_k)

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        self._metric = Counter(
            "radix_global_index_match_fallbacks", "Remote index matches answered by the local view "
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
            if getattr(code, "name", "") == "UNAUTHENTICATED" and not self._warned_auth:
                # key queries need the service's token (docs/interfaces.md, "Index service"):
                # without it every request is routed cache-blind, which must not go unnoticed
                self._warned_auth = True
                log.warning("the index service %s refused a match: the router needs its admin "
                            "token (--admin-token or RADIX_GLOBAL_ADMIN_TOKEN); routing "
                            "without the index meanwhile", self.target)
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
            self.client.deregister(WorkerId(entry.info.worker_id))  # drops its segment too
        except Exception as exc:  # unknown there already, or the service is down: logged only
            log.warning("index service deregister of %s failed: %r", entry.info.worker_id, exc)
            pool = entry.info.pool_id
            if pool is not None and is_segment(pool):  # timed out there: its segment may stay
                try:
                    self.client.remove_holder(PoolId(pool))
                except Exception as again:
                    log.warning("index service: dropping segment %s failed: %r", pool, again)

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
