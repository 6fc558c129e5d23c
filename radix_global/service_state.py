"""What the index service keeps besides the gRPC plumbing: the index (one ``GlobalIndex`` or a
``ShardedIndex``), the registered workers and their heartbeats, the event feed, and snapshots.

No sockets here: ``service.py`` wraps this in a gRPC server. Every method runs on the service's
event loop (the index is single-owner), and takes ``now`` from the injected clock.
Rules: ``docs/interfaces.md`` section 2 (registration, heartbeats) and 7 (shards).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from radix_global.index import GlobalIndex
from radix_global.registration import WorkerInfo
from radix_global.shards import ShardedIndex
from radix_global.snapshot import IndexSnapshot, SnapshotError
from radix_global.types import Namespace, WorkerId
from radix_global.wire import IdConflictError, UnknownWorkerError

log = logging.getLogger(__name__)

Index = GlobalIndex | ShardedIndex


class EventFeed(Protocol):
    """Feeds a worker's KV events into the index (``subscriber.py``)."""

    def subscribe(self, info: WorkerInfo) -> None: ...
    def unsubscribe(self, worker_id: WorkerId) -> None: ...


def new_index(shards: int, half_life_s: float | None = None) -> Index:
    make = (lambda: GlobalIndex(half_life_s)) if half_life_s else GlobalIndex
    return make() if shards == 1 else ShardedIndex([make() for _ in range(shards)])


def restore_index(data: Any, shards: int) -> Index:
    """The index of a snapshot; refuses one taken with another shard count (re-sharding would
    need every chain re-routed, which the routing map of a snapshot cannot tell reliably)."""
    sharded = isinstance(data, dict) and data.get("sharded") is True
    had = len(data["shards"]) if sharded else 1
    if had != shards:
        raise SnapshotError(f"snapshot was taken with {had} shard(s), service runs {shards}")
    return ShardedIndex.restore(data) if sharded else GlobalIndex.restore(data)


class ServiceState:
    """Registry + index + feed. Re-registering a worker id replaces its record."""

    def __init__(
        self,
        index: Index,
        feed: EventFeed | None = None,
        clock: Callable[[], float] | None = None,
        heartbeat_timeout_s: float = 20.0,
    ) -> None:
        import time

        self.index = index
        self.feed = feed
        self.clock = clock or time.time
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.workers: dict[WorkerId, WorkerInfo] = {}
        self.last_seen: dict[WorkerId, float] = {}
        self.reaped = 0

    # ---- workers --------------------------------------------------------------------------
    def register(self, info: WorkerInfo) -> bool:
        """Add or replace a worker; True when its KV events are now subscribed.

        Raises ``IdConflictError`` (pool id vs worker id) or ``PageSizeMismatchError`` before
        changing anything."""
        wid = WorkerId(info.worker_id)
        pools = {w.pool_id for w in self.workers.values() if w.worker_id != wid}
        if wid in pools:
            raise IdConflictError(f"worker id {wid!r} is already the pool id of another worker")
        if info.pool_id is not None and info.pool_id in self.workers:
            raise IdConflictError(f"pool id {info.pool_id!r} is already a worker id")
        self.index.register_namespace(Namespace(info.namespace), info.page_size)
        old = self.workers.get(wid)
        if old is not None and old != info:
            self._unsubscribe(wid)
            if old.namespace != info.namespace or old.dp_size != info.dp_size:
                self.index.remove_holder(wid)  # its pages are of another model or rank layout
        self.workers[wid] = info
        self.last_seen[wid] = self.clock()
        subscribed = info.kv_events_endpoint is not None and self.feed is not None
        if subscribed and old != info:
            assert self.feed is not None
            self.feed.subscribe(info)
        return subscribed

    def deregister(self, worker_id: WorkerId) -> None:
        """Forget a worker and drop its index entries (a pool's entries stay: the pool lives on)."""
        if worker_id not in self.workers:
            raise UnknownWorkerError(f"worker {worker_id!r} is not registered")
        self._unsubscribe(worker_id)
        del self.workers[worker_id]
        self.last_seen.pop(worker_id, None)
        self.index.remove_holder(worker_id)

    def heartbeat(self, worker_id: WorkerId) -> None:
        if worker_id not in self.workers:
            raise UnknownWorkerError(f"worker {worker_id!r} is not registered; register again")
        self.last_seen[worker_id] = self.clock()

    def reap(self) -> list[WorkerId]:
        """Deregister workers silent for longer than the heartbeat timeout."""
        now = self.clock()
        silent = [w for w, t in self.last_seen.items() if now - t > self.heartbeat_timeout_s]
        for wid in silent:
            silent_s = now - self.last_seen[wid]
            log.warning("worker %s silent for %.1f s: removed", wid, silent_s)
            self.deregister(wid)
        self.reaped += len(silent)
        return silent

    def _unsubscribe(self, worker_id: WorkerId) -> None:
        if self.feed is not None and self.workers[worker_id].kv_events_endpoint is not None:
            self.feed.unsubscribe(worker_id)

    # ---- snapshots ------------------------------------------------------------------------
    def take_snapshot(self) -> IndexSnapshot:
        workers = list(self.workers.values())
        return IndexSnapshot(self.clock(), self.index.snapshot(), workers)

    def restore_workers(self, workers: list[WorkerInfo]) -> None:
        """Re-register a snapshot's workers (re-subscribing to their events); the heartbeat
        clock restarts now, so a worker gone while the service was down is reaped after one
        timeout."""
        for info in workers:
            try:
                self.register(info)
            except Exception as exc:  # one bad record must not stop the restore
                log.warning("snapshot worker %s not restored: %s", info.worker_id, exc)

    def service_stats(self) -> dict[str, Any]:
        return {
            "workers": len(self.workers),
            "subscribed": sum(1 for w in self.workers.values() if w.kv_events_endpoint),
            "reaped": self.reaped,
        }
