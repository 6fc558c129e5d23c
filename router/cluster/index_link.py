"""The router's link to the global index: embedded (in-process) or a standalone service.

Embedded (default): a :class:`radix_global.index.GlobalIndex` in the router process, fed by one
ZMQ KV-event subscription per registered worker (``radix_global.subscriber``). The registry calls
:meth:`worker_added` / :meth:`worker_removed`; a removed worker's entries are dropped at once.
``--index HOST:PORT`` selects the standalone gRPC index service instead
(``router/cluster/remote_index.py``).

With ``snapshot_path`` the embedded index is saved there every ``snapshot_interval_s`` and at
stop, and restored at start, so a restarted router routes to the holders at once
(``docs/interfaces.md``, "The router's index snapshot"): a returning worker keeps its restored
entries only if it registers the same record again, and its feeds continue from the saved positions;
one that does not return within ``restore_grace_s`` loses them.

Both links answer the same questions: ``view`` (what the policies ``match`` against, never
blocking the loop), ``direct_view`` and ``hot_prefixes`` (off the request path: hot-prefix
warming; blocking when ``remote``), membership (``check``, ``worker_added``, ``worker_removed``,
``heartbeat``), ``prefetch_match``, ``stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from radix_global.index import GlobalIndex
from radix_global.index_metrics import IndexCollector
from radix_global.ops import HotPrefix, IndexRefusal
from radix_global.pool_ids import is_segment, leaving_with_worker
from radix_global.registration import WorkerInfo
from radix_global.snapshot import (
    FeedState,
    IndexSnapshot,
    SnapshotError,
    load_on_start,
    snapshot_every,
    write_now,
)
from radix_global.types import Namespace, PageKey, WorkerId
from router.cluster.registry import ConflictError, WorkerEntry
from router.cluster.remote_index import RemoteIndex
from router.routing.contract import IndexView

log = logging.getLogger("radix_global.router.index")


class EmbeddedIndex:
    """GlobalIndex + KV-event subscriptions, owned by the router's event loop."""

    remote = False  # its queries are in-process calls: on the event loop

    def __init__(self, lora_extra_keys: Mapping[str, str] | None = None, *,
                 snapshot_path: str | None = None, snapshot_interval_s: float = 0.0,
                 restore_grace_s: float = 20.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.snapshot_path = snapshot_path
        self.snapshot_interval_s = snapshot_interval_s
        self.restore_grace_s = restore_grace_s
        self._clock = clock
        self.restore_outcome = "off" if snapshot_path is None else "none"
        self._infos: dict[WorkerId, WorkerInfo] = {}  # followed workers: what a snapshot names
        # Workers whose entries were restored and who have not registered again yet.
        self._restored: dict[WorkerId, tuple[WorkerInfo, FeedState]] = {}
        self._grace: asyncio.TimerHandle | None = None
        self._periodic: asyncio.Task[None] | None = None
        # Restored before the policies take ``view``: the object they hold is never replaced.
        self.index = GlobalIndex()
        if snapshot_path:
            self._restore(snapshot_path)
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
        if self.snapshot_path is None:
            return
        loop = asyncio.get_running_loop()
        self._grace = loop.call_later(self.restore_grace_s, self._expire_restored)
        if self.snapshot_interval_s > 0:
            self._periodic = loop.create_task(snapshot_every(
                self.snapshot_interval_s, self.snapshot_path, self.take_snapshot))

    async def stop(self) -> None:
        """Finish pending membership changes, write the last snapshot, then close the feeds
        (closing drops their entries)."""
        if self._grace is not None:
            self._grace.cancel()
        if self._periodic is not None:
            self._periodic.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._periodic
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            if self.snapshot_path is not None:
                written = await write_now(self.snapshot_path, self.take_snapshot)
                log.info("index snapshot written: %s (%d bytes)", written.path,
                         written.size_bytes)
        except Exception as exc:  # the router still stops; the next start uses an older file
            log.error("index snapshot to %s failed: %r", self.snapshot_path, exc)
        finally:
            if self._subscriber is not None:
                await self._subscriber.close()
                self._subscriber = None

    # ---- snapshots (docs/interfaces.md, "The router's index snapshot") --------------------
    def take_snapshot(self) -> IndexSnapshot:
        """The index, the followed workers and their feeds' state, on the loop. Restored
        workers not back yet are kept as they were, so a second restart within the grace period
        does not lose them."""
        feeds = self._subscriber.feed_states() if self._subscriber is not None else {}
        workers = [i for w, i in self._infos.items() if w in feeds]  # else: nothing to resume
        for wid, (info, state) in self._restored.items():
            workers.append(info)
            feeds[wid] = state
        return IndexSnapshot(self._clock(), self.index.snapshot(), workers, feeds)

    def _restore(self, path: str) -> None:
        """Replace the (empty) index with the snapshot's. A bad file is logged and the router
        starts empty: a cache-blind router still serves, a router that refuses to start does
        not."""
        try:
            snap = load_on_start(path)
            if snap is None:
                return
            if not isinstance(snap.index, dict):
                raise SnapshotError(f"{path}: the index state is not a map")
            index = GlobalIndex.restore(snap.index, shift_s=self._clock() - snap.created_at)
        except (SnapshotError, IndexRefusal) as exc:
            self.restore_outcome = f"unreadable: {str(exc)[:300]}"
            log.error("index snapshot not restored, starting empty: %s", exc)
            return
        self.index = index
        for info in snap.workers:
            state = snap.feeds.get(info.worker_id)
            if state is not None and len(state.positions) == info.dp_size:
                self._restored[WorkerId(info.worker_id)] = (info, state)
            else:  # nothing to continue its stream from: its entries cannot be trusted
                self._drop(info)
        self.restore_outcome = f"restored {len(self._restored)} workers"
        log.info("index snapshot %s restored: %s", path, self.restore_outcome)

    def _expire_restored(self) -> None:
        for info, _ in self._restored.values():
            log.warning("worker %s did not come back within %.0f s: its restored index entries "
                        "are dropped", info.worker_id, self.restore_grace_s)
            self._drop(info)
        self._restored.clear()

    def _drop(self, info: WorkerInfo) -> None:
        """Drop a worker's entries, and its Mooncake segment's and that segment's disk tier's
        (they leave with it), unless another followed worker names that segment: the registry
        refuses a second
        holder of a segment, so that is only a guard, and the entries stay with the holder
        that is still there."""
        self.index.remove_holder(WorkerId(info.worker_id))
        if info.pool_id is not None and is_segment(info.pool_id):
            others = [w for w, i in self._infos.items()
                      if i.pool_id == info.pool_id and w != info.worker_id]
            if others:
                log.warning("worker %s left; segment %s stays: worker %s holds it",
                            info.worker_id, info.pool_id, others[0])
                return
        for holder in leaving_with_worker(info.pool_id, info.pool_disk_id):
            self.index.remove_holder(holder)

    async def _follow(self, entry: WorkerEntry, resume: FeedState | None) -> None:
        try:
            await self._subscriber.add_worker(entry.info, lora_extra_keys=entry.lora,
                                              resume=resume)
        except ValueError as exc:  # a saved state that cannot be this worker's
            log.warning("worker %s: restored feeds refused (%s): its entries are dropped",
                        entry.info.worker_id, exc)
            self._drop(entry.info)
            await self._subscriber.add_worker(entry.info, lora_extra_keys=entry.lora)

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
        wid = WorkerId(info.worker_id)
        restored = self._restored.pop(wid, None)
        resume = None
        if restored is not None and restored[0] == info:
            resume = restored[1]
        elif restored is not None:
            log.info("worker %s registered another record: its restored entries are dropped",
                     wid)
            self._drop(restored[0])
        if info.pool_id is not None and is_segment(info.pool_id):
            # A restored worker that named this segment and has not come back: the segment is
            # the new worker's now (a process at that address starts with an empty segment), so
            # the old entries go now, not when the old worker's grace period ends and takes the
            # new worker's entries with them.
            for other, (old_info, _) in list(self._restored.items()):
                if old_info.pool_id == info.pool_id:
                    log.info("worker %s registered segment %s of restored worker %s: the "
                             "restored entries are dropped", wid, info.pool_id, other)
                    del self._restored[other]
                    self._drop(old_info)
        self._infos[wid] = info
        if self._subscriber is not None and info.kv_events_endpoint:
            self._spawn(self._follow(entry, resume))

    def worker_removed(self, entry: WorkerEntry) -> None:
        self._infos.pop(WorkerId(entry.info.worker_id), None)
        if self._subscriber is not None:
            self._spawn(self._subscriber.remove_worker(WorkerId(entry.info.worker_id)))
        self._drop(entry.info)

    def heartbeat(self, worker_id: str) -> None:
        return None  # liveness is tracked by the registry; the subscriber's timeout is unused

    async def prefetch_match(self, namespace: Namespace, keys: Sequence[PageKey]) -> None:
        return None  # in-process: the policy's match is a local call already

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        """The embedded index's health (``radix_global/index_metrics.py``) in the router's
        ``/metrics``."""
        registry.register(IndexCollector(
            self.index.stats,
            lambda: self._subscriber.stats() if self._subscriber is not None else None))

    def _spawn(self, coro: Any) -> None:
        """Membership callbacks are synchronous; the subscriber's are coroutines: run them in
        order on the loop, keeping a reference so they are not garbage-collected."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("index membership change failed: %r", task.exception())

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": "embedded", "snapshot": {
            "path": self.snapshot_path, "restore": self.restore_outcome,
            "restored_waiting": sorted(self._restored)}}
        stats = self.index.stats()
        out.update(stats._asdict() if hasattr(stats, "_asdict") else {"stats": str(stats)})
        if self._subscriber is not None and hasattr(self._subscriber, "stats"):
            out["subscriber"] = self._subscriber.stats().as_dict()
        elif self._subscriber_error:
            out["subscriber"] = self._subscriber_error
        return out


ClusterIndex = EmbeddedIndex | RemoteIndex


def open_index(index_url: str | None, admin_token: str | None = None,
               match_timeout_s: float = 0.1,
               lora_extra_keys: Mapping[str, str] | None = None, *,
               snapshot_path: str | None = None, snapshot_interval_s: float = 0.0,
               restore_grace_s: float = 20.0,
               clock: Callable[[], float] = time.monotonic) -> ClusterIndex:
    """Embedded index by default; ``index_url`` (host:port of ``radix-global index serve``)
    selects the standalone service. ``lora_extra_keys``: adapter name -> SGLang extra key, for
    re-keying LoRA stores; the snapshot options and the clock: :class:`EmbeddedIndex` (embedded
    index only: ``RouterConfig`` refuses a snapshot with ``index_url``)."""
    if index_url is None:
        return EmbeddedIndex(lora_extra_keys, snapshot_path=snapshot_path,
                             snapshot_interval_s=snapshot_interval_s,
                             restore_grace_s=restore_grace_s, clock=clock)
    return RemoteIndex(index_url, admin_token, match_timeout_s)
