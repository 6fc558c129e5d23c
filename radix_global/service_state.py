"""What the index service keeps besides the gRPC plumbing: the index (one ``GlobalIndex`` or a
``ShardedIndex``), the registered workers, the KV-event subscriber (``subscriber.py``: event
feeds, heartbeats, timeouts), and snapshots.

No gRPC here: ``service.py`` wraps this in a gRPC server. Every method runs on the service's
event loop (the index is single-owner), and takes ``now`` from the injected clock.
Rules: ``docs/interfaces.md`` sections "Worker registration" (registration, heartbeats) and
"Shards".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from radix_global.index import GlobalIndex
from radix_global.pool_ids import is_segment, leaving_with_worker
from radix_global.registration import WorkerInfo
from radix_global.shards import ShardedIndex
from radix_global.snapshot import FeedState, IndexSnapshot, SnapshotError
from radix_global.subscriber import KVEventSubscriber
from radix_global.types import Namespace, WorkerId
from radix_global.wire import IdConflictError, UnknownWorkerError

log = logging.getLogger(__name__)

Index = GlobalIndex | ShardedIndex


def new_index(shards: int, half_life_s: float | None = None) -> Index:
    make = (lambda: GlobalIndex(half_life_s)) if half_life_s else GlobalIndex
    return make() if shards == 1 else ShardedIndex([make() for _ in range(shards)])


def restore_index(data: Any, shards: int) -> Index:
    """The index of a snapshot; refuses one taken with another shard count (re-sharding would
    need every chain re-routed, which the routing map of a snapshot cannot tell reliably).
    Every failure is a :class:`SnapshotError`."""
    try:
        sharded = isinstance(data, dict) and data.get("sharded") is True
        had = len(data["shards"]) if sharded else 1
        if had != shards:
            raise SnapshotError(f"snapshot was taken with {had} shard(s), service runs {shards}")
        return ShardedIndex.restore(data) if sharded else GlobalIndex.restore(data)
    except SnapshotError:
        raise
    except Exception as exc:  # RecursionError, OverflowError...: a bad file, never a crash
        raise SnapshotError(
            f"snapshot index state cannot be restored: {type(exc).__name__}: {str(exc)[:300]}"
        ) from exc


class ServiceState:
    """Registry + index + event subscriber. Re-registering a worker id replaces its record; an
    identical record only counts as a heartbeat (its index entries stay)."""

    def __init__(self, index: Index, heartbeat_timeout_s: float = 20.0,
                 clock: Callable[[], float] | None = None) -> None:
        self.index = index
        self.clock = clock or time.time  # hotness clock: wall time, so snapshots stay comparable
        self.workers: dict[WorkerId, WorkerInfo] = {}
        # Liveness (heartbeats and events) and event feeds are the subscriber's.
        self.subscriber = KVEventSubscriber(
            index, timeout_s=heartbeat_timeout_s, on_timeout=self._timed_out
        )

    # ---- workers --------------------------------------------------------------------------
    async def register(self, info: WorkerInfo, resume: FeedState | None = None) -> bool:
        """Add or replace a worker; True when its KV events are now followed (False: it has no
        endpoint, or the endpoint could not be subscribed; the worker is registered either way).
        ``resume``: its feeds' positions in a restored snapshot (``KVEventSubscriber.add_worker``).

        Raises ``IdConflictError`` (pool id vs worker id, a segment another worker holds) or
        ``PageSizeMismatchError`` before changing anything."""
        wid = WorkerId(info.worker_id)
        pools = {w.pool_id for w in self.workers.values() if w.worker_id != wid}
        if wid in pools:
            raise IdConflictError(f"worker id {wid!r} is already the pool id of another worker")
        if info.pool_id is not None and info.pool_id in self.workers:
            raise IdConflictError(f"pool id {info.pool_id!r} is already a worker id")
        if info.pool_id is not None and is_segment(info.pool_id) and info.pool_id in pools:
            # a segment is one worker's and leaves the index with it (docs/interfaces.md,
            # "Mooncake Store as the L3 pool"): a second holder would take the first one's entries
            # when it left
            raise IdConflictError(f"pool id {info.pool_id!r} is a Mooncake segment another "
                                  "worker registered: each worker needs its own")
        self.index.register_namespace(Namespace(info.namespace), info.page_size)
        if self.workers.get(wid) == info and self.subscriber.heartbeat(wid):
            return self.subscriber.subscribed(wid)
        self.workers[wid] = info
        # a changed record: old entries dropped
        return await self.subscriber.add_worker(info, resume=resume)

    async def deregister(self, worker_id: WorkerId) -> None:
        """Forget a worker and drop its index entries (a pool's entries stay: the pool lives on;
        a segment of a shared store goes with its worker, ``radix_global/pool_ids.py``)."""
        info = self.workers.pop(worker_id, None)
        if info is None:
            raise UnknownWorkerError(f"worker {worker_id!r} is not registered")
        await self.subscriber.remove_worker(worker_id)
        self._drop_segment(info)

    def heartbeat(self, worker_id: WorkerId) -> None:
        if not self.subscriber.heartbeat(worker_id):
            raise UnknownWorkerError(f"worker {worker_id!r} is not registered; register again")

    def _timed_out(self, worker_id: WorkerId) -> None:
        info = self.workers.pop(worker_id, None)
        if info is not None:
            self._drop_segment(info)

    def _drop_segment(self, info: WorkerInfo) -> None:
        for holder in leaving_with_worker(info.pool_id, info.pool_disk_id):
            self.index.remove_holder(holder)

    # ---- snapshots ------------------------------------------------------------------------
    def take_snapshot(self) -> IndexSnapshot:
        workers = list(self.workers.values())
        return IndexSnapshot(self.clock(), self.index.snapshot(), workers,
                             self.subscriber.feed_states())

    async def restore_workers(self, workers: list[WorkerInfo],
                              feeds: dict[str, FeedState] | None = None) -> None:
        """Re-register a snapshot's workers, without dropping the restored entries, and follow
        their events again from the saved feed positions (``docs/interfaces.md``,
        "The router's index snapshot"). Their heartbeat clock restarts now, so a worker gone while
        the service was down is removed after one timeout. Without a position (an older file), the
        first live event shows a seq gap: the subscriber replays it or drops the worker's entries
        and resyncs."""
        for info in workers:
            resume = (feeds or {}).get(info.worker_id)
            try:
                try:
                    await self.register(info, resume)
                except ValueError as exc:  # a state that cannot be its: resync from live
                    log.warning("snapshot feeds of %s not resumed: %s", info.worker_id, exc)
                    await self.register(info)
            except Exception as exc:  # one bad record must not stop the restore
                log.warning("snapshot worker %s not restored: %s", info.worker_id, exc)

    def service_stats(self) -> dict[str, Any]:
        return {
            "workers": len(self.workers),
            "subscribed": sum(1 for w in self.workers if self.subscriber.subscribed(w)),
            "events": self.subscriber.stats().as_dict(),
        }
