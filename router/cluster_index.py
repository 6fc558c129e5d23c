"""The router's link to the global index: embedded (in-process) or a standalone service.

Embedded (default): a :class:`radix_global.index.GlobalIndex` in the router process, fed by one
ZMQ KV-event subscription per registered worker (``radix_global.subscriber``). The registry calls
:meth:`worker_added` / :meth:`worker_removed`; a removed worker's entries are dropped at once.
``--index HOST:PORT`` selects the standalone gRPC index service instead (``radix_global.service``,
client ``radix_global.client.IndexClient``).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from radix_global.index import GlobalIndex
from radix_global.ops import IndexRefusal
from radix_global.types import Namespace, WorkerId
from router.workers import ConflictError, WorkerEntry

log = logging.getLogger("radix_global.router.index")


class EmbeddedIndex:
    """GlobalIndex + KV-event subscriptions, owned by the router's event loop."""

    def __init__(self) -> None:
        self.index = GlobalIndex()
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
            self._subscriber = self._subscriber_cls(self.index)
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
            self._spawn(self._subscriber.add_worker(info))

    def worker_removed(self, entry: WorkerEntry) -> None:
        if self._subscriber is not None:
            self._spawn(self._subscriber.remove_worker(WorkerId(entry.info.worker_id)))
        self.index.remove_holder(WorkerId(entry.info.worker_id))

    def heartbeat(self, worker_id: str) -> None:
        return None  # liveness is tracked by the registry; the subscriber's timeout is unused

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


class RemoteIndex:
    """The standalone index service (``radix-global index serve``) through its gRPC client.

    The service subscribes to the workers' KV events itself; the router registers and deregisters
    workers there and forwards their liveness as heartbeats. ``match`` is a blocking call on the
    event loop (one loopback round trip per request).
    """

    def __init__(self, target: str, admin_token: str | None = None) -> None:
        from radix_global.client import IndexClient

        self.target = target.removeprefix("grpc://").removeprefix("http://")
        self.client = IndexClient(self.target, admin_token=admin_token)

    @property
    def view(self) -> Any:
        return self.client

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
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
        try:
            return {"mode": "service", "target": self.target, **self.client.stats()}
        except Exception as exc:
            return {"mode": "service", "target": self.target, "error": repr(exc)}


ClusterIndex = EmbeddedIndex | RemoteIndex


def open_index(index_url: str | None, admin_token: str | None = None) -> ClusterIndex:
    """Embedded index by default; ``index_url`` (host:port of ``radix-global index serve``)
    selects the standalone service."""
    if index_url is None:
        return EmbeddedIndex()
    return RemoteIndex(index_url, admin_token)
