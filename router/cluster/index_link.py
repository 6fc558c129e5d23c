"""The router's link to the global index: embedded (in-process) or a standalone service.

Embedded (default): a :class:`radix_global.index.GlobalIndex` in the router process, fed by one
ZMQ KV-event subscription per registered worker (``radix_global.subscriber``). The registry calls
:meth:`worker_added` / :meth:`worker_removed`; a removed worker's entries are dropped at once.
``--index HOST:PORT`` selects the standalone gRPC index service instead
(``router/cluster/remote_index.py``).

Both links answer the same questions: ``view`` (what the policies ``match`` against, never
blocking the loop), ``direct_view`` and ``hot_prefixes`` (off the request path: hot-prefix
warming; blocking when ``remote``), membership (``check``, ``worker_added``, ``worker_removed``,
``heartbeat``), ``prefetch_match``, ``stats``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from radix_global.index import GlobalIndex
from radix_global.ops import HotPrefix, IndexRefusal
from radix_global.pool_ids import is_segment
from radix_global.types import Namespace, PageKey, PoolId, WorkerId
from router.cluster.registry import ConflictError, WorkerEntry
from router.cluster.remote_index import RemoteIndex
from router.routing.contract import IndexView

log = logging.getLogger("radix_global.router.index")


class EmbeddedIndex:
    """GlobalIndex + KV-event subscriptions, owned by the router's event loop."""

    remote = False  # its queries are in-process calls: on the event loop

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

    @property
    def direct_view(self) -> IndexView:
        """The same in-process index as :attr:`view` (no prefetching to bypass)."""
        return self.index

    def hot_prefixes(self, namespace: Namespace, top_k: int, now: float) -> list[HotPrefix]:
        """The ``top_k`` hottest prefixes of ``namespace`` at ``now`` (``GlobalIndex.
        hot_prefixes``); raises ``IndexRefusal`` for a namespace the index does not know."""
        return self.index.hot_prefixes(namespace, top_k, now)

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
        pool = entry.info.pool_id
        if pool is not None and is_segment(pool):  # its segment left the store with it
            self.index.remove_holder(PoolId(pool))

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
