"""An L3 pool over a Mooncake Store (``mooncake.store.MooncakeDistributedStore``, TCP): pages
that any worker host of the cluster can fetch, not only the host that computed them.

Each process that opens the pool is a Mooncake client. It contributes a segment of
``segment_bytes`` of its host's memory to the store, and it asks for its pages to be written
into that segment (``ReplicateConfig.preferred_segment`` = its own segment, one replica). A page
computed on host A therefore lives on A, and a worker on host B fetches it over the network.
Placement is preferred, not guaranteed: when A's segment is full, Mooncake may put a page in
another host's segment. The index then names A's segment for a page that lives elsewhere. If
that other host dies, the writer's resync (:meth:`MooncakePagePool.vanished`) finds the page
gone. If A dies, the index drops a page that still exists, which is an underestimate. The master
(``mooncake_master``) runs somewhere reachable (``docs/deploy.md``). Clients find each other
through it, with P2P handshakes and no etcd.

Where this pool keeps the :class:`~sglang_patch.pool.base.PagePool` contract:
- Keys are stored as given.
- A page is the concatenation of its buffers plus an 8-byte xxh3 checksum of it. ``get_into``
  verifies it, and a page whose bytes do not match is removed (``force``, past Mooncake's read
  lease) and is a miss. A put of an existing key does not overwrite in Mooncake, so a corrupt
  page would stay corrupt; removing it lets the next put write it anew.
- ``get_into`` is True only for the exact bytes of a put.

Where it cannot keep it, the contract is loosened (Mooncake does not tell its clients):
- ``put`` never reports evictions. Mooncake evicts silently at its high watermark, so
  ``evicted`` is always ``()``.
- ``new`` means the key was absent just before this put. Another host may write it in between.
- ``capacity_pages`` is this client's own segment in pages, not the store's.
- ``clear`` empties the whole store, every host's pages, and names only the pages this client
  wrote.
- ``stats().pages`` is ``-1`` (unknown); ``evictions`` counts the pages ``vanished`` found
  gone.
- A dead client's pages may stay listed by the master for minutes (measured: 2.5 minutes after
  its client expired), and a read of one stalls until the transport gives up: reads skip the
  replicas on hosts known lost (``sglang_patch/pool/lost_hosts.py``; docs/interfaces.md,
  "Mooncake Store as the L3 pool": reads around a lost host). A read in flight to a host that
  dies stalls at most ``read_stall_s`` (``sglang_patch/pool/mooncake_stall.py``).
- Silent evictions are found by :meth:`MooncakePagePool.vanished`. It probes the pages this
  client wrote, in the order of :class:`~sglang_patch.pool.probe_queue.ProbeQueue` (pages in
  demand first: read, found or written again through this client since their last probe; then
  round-robin; at most ``capacity_pages`` remembered) and returns the tags of those the store no
  longer has. The storage backend publishes their removal (``sglang_patch/storage.py``, every
  ``pool_resync_s``). A probe takes Mooncake's 10 s read lease, which delays the eviction of what
  it probes, so a round is bounded (``pool_resync_pages``) and a page not in demand is probed
  at most every ``probe_spread`` rounds.

Buffers (Mooncake moves bytes between registered memory only). Every call is a batch call: a
single ``put`` / ``get_into`` is a batch of one.
- Packed (the default): each page is copied into a slot of a registered staging area, its
  checksum after it, and moves as one transfer (``batch_put_from`` / ``batch_get_into``); a read
  is verified in its slot before it is copied out, so the caller never sees unverified bytes.
- Zero-copy: pages whose chunks lie in memory the caller registered (:meth:`register_memory`;
  the storage backend passes SGLang's whole host KV buffer) and average at least
  ``zero_copy_min_chunk`` bytes move as one transfer per chunk plus one for the checksum slot
  (``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``), with no copy on this
  side. Over TCP every transfer has its own cost, so small chunks go faster packed. A page that
  fails its checksum has already landed in the caller's buffers: it is reported False, and the
  caller must not use those bytes (SGLang keeps only the leading run of loaded pages).
- A call carries at most ``BATCH_BUFFERS`` transfers (Mooncake's TCP queue per peer is bounded).
- One lock is held across the store's calls, so one process's pool I/O runs one call at a time.
  After :meth:`MooncakePagePool.close` every call is a miss.
``RADIX_GLOBAL_POOL_NO_VERIFY=1`` turns verification off, for the negative-control test only.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

from radix_global.types import PoolId
from sglang_patch.pool.base import (
    PageIO,
    PagePool,
    PoolError,
    PoolStats,
    PutResult,
    as_bytes,
)
from sglang_patch.pool.lost_hosts import LostHosts
from sglang_patch.pool.mooncake_calls import (
    BATCH_BUFFERS,
    ZERO_COPY_MIN_CHUNK,
    CallPage,
    address_of,
    plan_calls,
)
from sglang_patch.pool.mooncake_stall import DEFAULT_READ_STALL_S, bound_stalls
from sglang_patch.pool.probe_queue import ProbeQueue

NO_VERIFY_ENV = "RADIX_GLOBAL_POOL_NO_VERIFY"
CHECKSUM_BYTES = 8
STAGING_BYTES = 16 << 20  # packed pages' slots (at least one page)
# A resync probe pins the page for Mooncake's 10 s read lease: with rounds every 10 s
# (storage.py), a page probed every 4th round is pinned a quarter of the time.
DEFAULT_PROBE_SPREAD = 4
DEFAULT_SEGMENT_BYTES = 256 << 20
MIN_SEGMENT_BYTES = 16 << 20  # Mooncake refuses smaller segments (setup fails with -600)
OBJECT_NOT_FOUND = -704  # Mooncake's error for a key it does not have
COPY_TIMEOUT_S = 10.0  # a copy task not done by then is taken as failed
log = logging.getLogger(__name__)
_MISS = PutResult(False, False, ())


def _digest(views: Sequence[memoryview]) -> bytes:
    h = xxhash.xxh3_64()
    for v in views:
        h.update(v)
    return h.digest()


def mooncake_store(read_stall_s: float = DEFAULT_READ_STALL_S) -> Any:
    """A new Mooncake client whose transfers give up on a silent peer after ``read_stall_s``
    (:func:`bound_stalls`; the import is deferred: the shm pool never needs it)."""
    bound_stalls(read_stall_s, os.environ)
    from mooncake.store import MooncakeDistributedStore

    return MooncakeDistributedStore()


def _replicate_config(segment: str) -> Any:
    from mooncake.store import ReplicateConfig

    config = ReplicateConfig()
    config.replica_num = 1
    config.preferred_segment = segment
    return config


class MooncakePagePool(PagePool):
    """Pages in a Mooncake Store, one client per process (see module contract)."""

    def __init__(self, pool_id: str, page_bytes: int, master: str, local_hostname: str,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 store_factory: Callable[[], Any] | None = None,
                 zero_copy_min_chunk: int = ZERO_COPY_MIN_CHUNK,
                 probe_spread: int = DEFAULT_PROBE_SPREAD,
                 read_stall_s: float = DEFAULT_READ_STALL_S) -> None:
        if page_bytes <= 0 or segment_bytes < max(MIN_SEGMENT_BYTES,
                                                  page_bytes + CHECKSUM_BYTES):
            raise PoolError(f"a Mooncake segment of {segment_bytes} bytes: at least "
                            f"{MIN_SEGMENT_BYTES >> 20} MiB and a page of {page_bytes} bytes")
        self.pool_id = PoolId(pool_id)
        self.page_bytes = page_bytes
        self.capacity_pages = segment_bytes // (page_bytes + CHECKSUM_BYTES)
        self.verify = os.environ.get(NO_VERIFY_ENV) != "1"
        self.zero_copy_min_chunk = zero_copy_min_chunk
        self._slot_bytes = page_bytes + CHECKSUM_BYTES
        self._slot_count = max(1, min(BATCH_BUFFERS, STAGING_BYTES // self._slot_bytes))
        if probe_spread <= 0:
            raise PoolError(f"pool_resync_spread must be > 0, got {probe_spread}")
        self._probes = ProbeQueue(self.capacity_pages, probe_spread)
        self._store = store_factory() if store_factory else mooncake_store(read_stall_s)
        # Mooncake's own buffer, for the calls that allocate (we always pass registered
        # memory): the minimum
        local_buffer = max(16 << 20, 4 * self._slot_bytes)
        rc = self._store.setup(local_hostname, "P2PHANDSHAKE", segment_bytes, local_buffer,
                               "tcp", "", master)
        if rc != 0:
            raise PoolError(f"Mooncake Store at {master}: setup as {local_hostname} failed "
                            f"({rc}): is mooncake_master running and reachable?")
        self._segment = str(self._store.get_hostname())
        self._config = _replicate_config(self._segment)
        self._staging = np.zeros(self._slot_count * self._slot_bytes, dtype=np.uint8)
        # a checksum slot per zero-copy page of a call (each has >= 2 transfers)
        self._sums = np.zeros(BATCH_BUFFERS // 2 * CHECKSUM_BYTES, dtype=np.uint8)
        self._regions: list[tuple[int, int]] = []  # registered [start, end) of callers' memory
        self._registered: list[int] = []
        for buf in (self._staging, self._sums):
            ptr = int(buf.ctypes.data)
            if self._store.register_buffer(ptr, buf.nbytes) != 0:
                self._unregister()
                self._store.close()
                raise PoolError("Mooncake Store: registering the staging buffers failed")
            self._registered.append(ptr)
        self._ptr, self._sums_ptr = self._registered
        self._lock = threading.Lock()
        self._counts = {"copies": 0, "stores": 0, "hits": 0, "misses": 0, "checksum_failures": 0,
                        "vanished": 0, "put_failures": 0, "batch_calls": 0,
                        "zero_copy_calls": 0, "lost_skips": 0,
                        "replica_lookup_failures": 0}
        self._lost = LostHosts(self._segment)
        self._closed = False

    # --- PagePool ---------------------------------------------------------------------------------
    def register_memory(self, buffer: object) -> None:
        view = as_bytes(buffer)
        ptr, size = address_of(view), view.nbytes
        with self._lock:
            if self._closed or size == 0 or any(lo <= ptr and ptr + size <= hi
                                                     for lo, hi in self._regions):
                return
            if self._store.register_buffer(ptr, size) != 0:
                log.warning("Mooncake Store: registering %d bytes of host memory failed; "
                            "pages are packed through a copy", size)
                return
            self._registered.append(ptr)
            self._regions.append((ptr, ptr + size))

    def put(self, key: str, chunks: Sequence[object], tag: int = 0) -> PutResult:
        return self.put_many([PageIO(key, chunks, tag)])[0]

    def put_many(self, pages: Sequence[PageIO]) -> list[PutResult]:
        results: list[PutResult] = [_MISS] * len(pages)
        for batch in self._batches(pages):
            with self._lock:
                if self._closed:
                    break
                exists = self._store.batch_is_exist([d.key for d in batch])
                todo: list[CallPage] = []
                for d, e in zip(batch, exists, strict=True):
                    if e == 1:
                        self._probes.read(d.key)
                        results[d.at] = PutResult(True, False, ())
                    else:
                        todo.append(d)
                if not todo:
                    continue
                self._counts["batch_calls"] += 1
                keys = [d.key for d in todo]
                if todo[0].direct:
                    self._counts["zero_copy_calls"] += 1
                    for j, d in enumerate(todo):
                        self._sum_slot(j)[:] = np.frombuffer(_digest(d.views), dtype=np.uint8)
                    ptrs, sizes = self._buffers(todo)
                    rcs = self._store.batch_put_from_multi_buffers(keys, ptrs, sizes,
                                                                    self._config)
                else:
                    for j, d in enumerate(todo):
                        self._pack(j, d)
                    rcs = self._store.batch_put_from(keys, self._slots(todo),
                                                     [d.size + CHECKSUM_BYTES for d in todo],
                                                     self._config)
                for d, rc in zip(todo, rcs, strict=True):
                    results[d.at] = self._stored(d.key, d.tag, rc)
        return results

    def get_into(self, key: str, chunks: Sequence[object]) -> bool:
        return self.get_many([PageIO(key, chunks)])[0]

    def get_many(self, pages: Sequence[PageIO]) -> list[bool]:
        results = [False] * len(pages)
        batches = self._batches(pages)
        with self._lock:  # the pages no call carries (oversized, or after close)
            self._counts["misses"] += len(pages) - sum(len(b) for b in batches)
        for batch in batches:
            with self._lock:
                if self._closed:
                    self._counts["misses"] += len(batch)
                    continue
                where = self._replicas([d.key for d in batch])
                cut, probes = self._lost.plan([d.key for d in batch], where)
                for j in probes:  # hosts not read from lately: one key alone first
                    self._read([batch[j]], results, where)
                cut, _ = self._lost.plan([d.key for d in batch], where)  # what they taught
                rest = [d for j, d in enumerate(batch[:cut]) if j not in probes]
                skipped = len([j for j in range(cut, len(batch)) if j not in probes])
                self._counts["misses"] += skipped
                self._counts["lost_skips"] += skipped
                if rest:
                    self._read(rest, results, where)
        return results

    def _read(self, batch: list[CallPage], results: list[bool],
              where: dict[str, list[str]]) -> None:
        """One batch call (under the lock): the pages read into ``results``, and whether their
        replicas' hosts answered (``where``) into the lost hosts."""
        self._counts["batch_calls"] += 1
        keys = [d.key for d in batch]
        if batch[0].direct:
            self._counts["zero_copy_calls"] += 1
            ptrs, sizes = self._buffers(batch)
            got = self._store.batch_get_into_multi_buffers(keys, ptrs, sizes, False)
        else:
            got = self._store.batch_get_into(keys, self._slots(batch),
                                             [d.size + CHECKSUM_BYTES for d in batch])
        for j, (d, n) in enumerate(zip(batch, got, strict=True)):
            # bytes read, or a negative error (a missing key, a dead client's segment, an
            # object of another size)
            if n == d.size + CHECKSUM_BYTES and self._verified(j, d):
                results[d.at] = self._hit(d.key)
                self._lost.seen(where.get(d.key, ()))
            else:
                self._counts["misses"] += 1
                if n < 0 and n != OBJECT_NOT_FOUND:  # gone in between is no host's fault
                    self._lost.failed(where.get(d.key, ()))

    def told_lost(self, hosts: list[str]) -> None:
        """The routers' lost hosts (:meth:`LostHosts.told`; not behind a stalled read)."""
        self._lost.told(hosts)

    def lost_hosts(self) -> list[str]:
        """The hosts whose replicas this reader skips now (reads around a lost host)."""
        with self._lock:
            return self._lost.hosts()

    def _replicas(self, keys: list[str]) -> dict[str, list[str]]:
        """Where the master says each key's memory replicas are (transfer endpoints); under
        the lock. A failing call says nothing."""
        try:
            return {key: [str(r.get_memory_descriptor().buffer_descriptor.transport_endpoint)
                          for r in replicas if r.is_memory_replica()]
                    for key, replicas in self._store.batch_get_replica_desc(keys).items()}
        except Exception as exc:  # whatever the master did: no knowledge, no harm
            self._counts["replica_lookup_failures"] += 1
            if self._counts["replica_lookup_failures"] % 1000 == 1:
                log.warning("batch_get_replica_desc failed (%d so far): %r",
                            self._counts["replica_lookup_failures"], exc)
            return {}

    def vanished(self, limit: int) -> list[int]:
        """Tags of the pages this client wrote that the store no longer holds (evicted or
        removed), probing at most ``limit`` of them in :class:`ProbeQueue` order; the vanished
        ones are forgotten. Pages pushed out of the remembered set (more than
        ``capacity_pages`` written since) are reported too, unprobed."""
        with self._lock:
            gone = self._probes.take_forgotten()
            if self._closed:
                return gone
            keys = self._probes.next(limit)
            if keys:
                found = self._store.batch_is_exist(keys)
                # 1, or an error (<0): kept, probed again later
                gone += self._probes.probed({k: e != 0 for k, e in zip(keys, found, strict=True)})
            self._counts["vanished"] += len(gone)
            return gone

    def copy_here(self, keys: Sequence[str], tags: Sequence[int],
                  timeout_s: float = COPY_TIMEOUT_S) -> list[bool]:
        """Copy each existing object ``keys[i]`` into this client's own segment
        (``create_copy_task``; docs/interfaces.md, "Where hosts are"), waiting up to
        ``timeout_s`` plus 50 ms a key for the tasks; True where the copy is made. The lock is
        taken call by call (SGLang's reads and writes go on meanwhile). The copies of the
        leading run are remembered as written (``tags[i]``), so the resync tells the index
        when they are gone; a copy past a gap is not published, so it is not remembered."""
        tasks: list[Any] = []
        for key in keys:
            with self._lock:
                if self._closed:
                    return [False] * len(keys)
                task, rc = self._store.create_copy_task(key, [self._segment])
            tasks.append(task if rc == 0 else None)
        done: list[bool | None] = [None if t is not None else False for t in tasks]
        deadline = time.monotonic() + timeout_s + 0.05 * len(keys)
        while any(d is None for d in done) and time.monotonic() < deadline:
            time.sleep(0.05)
            for i, task in enumerate(tasks):
                if done[i] is not None:
                    continue
                with self._lock:
                    if self._closed:
                        return [False] * len(keys)
                    response, rc = self._store.query_task(task)
                status = str(response.status) if rc == 0 and response is not None else ""
                if status.endswith("SUCCESS"):
                    done[i] = True
                elif rc != 0 or status.endswith(("FAILED", "FAILURE", "ERROR")):
                    done[i] = False
        ok = [bool(d) for d in done]
        run = next((i for i, copied in enumerate(ok) if not copied), len(ok))
        with self._lock:
            for key, tag in zip(keys[:run], tags[:run], strict=True):
                self._probes.written(key, tag)
            self._counts["copies"] += sum(ok)
        return ok

    def exists(self, key: str) -> bool:
        with self._lock:
            found = not self._closed and bool(self._store.is_exist(key) == 1)
            if found and self._lost.known() and self._lost.unreadable(
                    self._replicas([key]).get(key, [])):
                self._counts["lost_skips"] += 1
                found = False
            if found:
                self._probes.read(key)
            return found

    def remove(self, key: str) -> bool:
        with self._lock:
            self._probes.forget(key)
            return not self._closed and bool(self._store.remove(key, True) == 0)

    def clear(self) -> list[int]:
        """Empty the whole store (every host's pages); the tags of the pages this client wrote
        (what it can name)."""
        with self._lock:
            tags = self._probes.clear()
            if not self._closed:
                rc = self._store.remove_all(True)
                if rc < 0:
                    log.warning("Mooncake remove_all failed (%d)", rc)
            return tags

    def stats(self) -> PoolStats:
        with self._lock:
            c = dict(self._counts)
        return PoolStats(self.pool_id, -1, self.capacity_pages, self.page_bytes, c["stores"],
                         c["hits"], c["misses"], c["vanished"], c["checksum_failures"], 0)

    def close(self) -> None:
        """Leave the store: this client's segment (and the pages in it) goes with it. Waits
        for a call in progress; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._unregister()
            self._store.close()

    # --- helpers (under the lock unless said) ---------------------------------------------------
    def _batches(self, pages: Sequence[PageIO]) -> list[list[CallPage]]:
        with self._lock:
            regions = list(self._regions)
        return plan_calls(pages, regions, self.page_bytes, self.zero_copy_min_chunk,
                          self._slot_count)

    def _buffers(self, batch: list[CallPage]) -> tuple[list[list[int]], list[list[int]]]:
        """Each page's buffers, its checksum slot last (the object's layout: bytes, checksum)."""
        ptrs = [[*(a for a, _ in d.spans), self._sums_ptr + j * CHECKSUM_BYTES]
                for j, d in enumerate(batch)]
        sizes = [[*(n for _, n in d.spans), CHECKSUM_BYTES] for d in batch]
        return ptrs, sizes

    def _slot(self, j: int) -> np.ndarray:
        """Staging slot ``j`` (a packed page and its checksum)."""
        return self._staging[j * self._slot_bytes:(j + 1) * self._slot_bytes]

    def _sum_slot(self, j: int) -> np.ndarray:
        """Checksum slot ``j`` (of the ``j``-th zero-copy page of a call)."""
        return self._sums[j * CHECKSUM_BYTES:(j + 1) * CHECKSUM_BYTES]

    def _slots(self, batch: list[CallPage]) -> list[int]:
        return [self._ptr + j * self._slot_bytes for j in range(len(batch))]

    def _pack(self, j: int, d: CallPage) -> None:
        """Page ``d`` and its checksum into staging slot ``j``."""
        slot, at = self._slot(j), 0
        for v in d.views:
            slot[at:at + v.nbytes] = np.frombuffer(v, dtype=np.uint8)
            at += v.nbytes
        slot[at:at + CHECKSUM_BYTES] = np.frombuffer(_digest(d.views), dtype=np.uint8)

    def _verified(self, j: int, d: CallPage) -> bool:
        """Page ``d``, read as the ``j``-th of its call, matches its checksum (if not, it is
        removed); a packed page is then copied out of its slot, so the caller never sees
        unverified bytes."""
        if d.direct:
            views: list[memoryview] = d.views
            checksum = self._sum_slot(j)
        else:
            slot = self._slot(j)
            views, checksum = [slot[:d.size].data], slot[d.size:d.size + CHECKSUM_BYTES]
        if self.verify and _digest(views) != checksum.tobytes():
            self._counts["checksum_failures"] += 1
            self._store.remove(d.key, True)  # force: past the read lease we just took
            self._probes.forget(d.key)
            log.warning("Mooncake page %s failed its checksum: removed", d.key)
            return False
        if not d.direct:
            at = 0
            for v in d.views:
                v[:] = views[0][at:at + v.nbytes]
                at += v.nbytes
        return True

    def _stored(self, key: str, tag: int, rc: int) -> PutResult:
        if rc != 0:
            self._counts["put_failures"] += 1
            if self._counts["put_failures"] % 100 == 1:  # a full store fails every put
                log.warning("Mooncake put failed (%d; %d failures so far): %s", rc,
                            self._counts["put_failures"], key)
            return _MISS
        self._probes.written(key, tag)
        self._counts["stores"] += 1
        return PutResult(True, True, ())

    def _hit(self, key: str) -> bool:
        self._counts["hits"] += 1
        self._probes.read(key)
        return True

    def _unregister(self) -> None:
        for ptr in self._registered:
            self._store.unregister_buffer(ptr)
        self._registered.clear()
        self._regions.clear()

