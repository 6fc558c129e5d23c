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
- A dead client's pages vanish after Mooncake's ``client_ttl`` (about 10 s). Until then
  ``exists`` says yes and ``get_into`` misses.
- Silent evictions are found by :meth:`MooncakePagePool.vanished`. It probes, round-robin, the
  pages this client wrote (at most ``capacity_pages`` are remembered) and returns the tags of
  those the store no longer has. The storage backend publishes their removal
  (``sglang_patch/storage.py``, every ``pool_resync_s``). A probe takes Mooncake's 10 s read
  lease, which delays the eviction of what it probes, so a resync round is bounded
  (``pool_resync_pages``).

Buffers: one registered staging buffer per process (page + checksum) under a lock, which is
held across the store's network calls, so one process's pool I/O runs one call at a time. A
page is copied once between it and the caller's buffers (SGLang's host pool), which keeps the
host pool's memory out of Mooncake's registration. The zero-copy multi-buffer calls are a later
step. After :meth:`MooncakePagePool.close` every call is a miss.
``RADIX_GLOBAL_POOL_NO_VERIFY=1`` turns verification off, for the negative-control test only.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

from radix_global.types import PoolId
from sglang_patch.pool.base import PagePool, PoolError, PoolStats, PutResult

NO_VERIFY_ENV = "RADIX_GLOBAL_POOL_NO_VERIFY"
CHECKSUM_BYTES = 8
DEFAULT_SEGMENT_BYTES = 256 << 20
MIN_SEGMENT_BYTES = 16 << 20  # Mooncake refuses smaller segments (setup fails with -600)
log = logging.getLogger(__name__)
_MISS = PutResult(False, False, ())


def _flat(buf: object) -> memoryview:
    view = memoryview(buf)  # type: ignore[arg-type]
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def mooncake_store() -> Any:
    """A new Mooncake client (the import is deferred: the shm pool never needs it)."""
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
                 store_factory: Callable[[], Any] = mooncake_store) -> None:
        if page_bytes <= 0 or segment_bytes < max(MIN_SEGMENT_BYTES,
                                                  page_bytes + CHECKSUM_BYTES):
            raise PoolError(f"a Mooncake segment of {segment_bytes} bytes: at least "
                            f"{MIN_SEGMENT_BYTES >> 20} MiB and a page of {page_bytes} bytes")
        self.pool_id = PoolId(pool_id)
        self.page_bytes = page_bytes
        self.capacity_pages = segment_bytes // (page_bytes + CHECKSUM_BYTES)
        self.verify = os.environ.get(NO_VERIFY_ENV) != "1"
        self._store = store_factory()
        # The local buffer is where Mooncake stages transfers; one page plus slack is enough
        # for our one-page calls.
        local_buffer = max(16 << 20, 4 * (page_bytes + CHECKSUM_BYTES))
        rc = self._store.setup(local_hostname, "P2PHANDSHAKE", segment_bytes, local_buffer,
                               "tcp", "", master)
        if rc != 0:
            raise PoolError(f"Mooncake Store at {master}: setup as {local_hostname} failed "
                            f"({rc}): is mooncake_master running and reachable?")
        self._segment = str(self._store.get_hostname())
        self._config = _replicate_config(self._segment)
        self._staging = np.zeros(page_bytes + CHECKSUM_BYTES, dtype=np.uint8)
        self._ptr = int(self._staging.ctypes.data)
        if self._store.register_buffer(self._ptr, self._staging.nbytes) != 0:
            self._store.close()
            raise PoolError("Mooncake Store: registering the staging buffer failed")
        self._lock = threading.Lock()
        self._counts = {"stores": 0, "hits": 0, "misses": 0, "checksum_failures": 0,
                        "vanished": 0, "put_failures": 0}
        # key -> tag of the pages this client wrote, in probing order (see vanished)
        self._written: collections.OrderedDict[str, int] = collections.OrderedDict()
        # tags dropped from _written, reported by vanished (bounded: with no resync running,
        # nobody drains it)
        self._forgotten: collections.deque[int] = collections.deque(maxlen=self.capacity_pages)
        self._closed = False

    # --- PagePool ---------------------------------------------------------------------------------
    def put(self, key: str, chunks: Sequence[object], tag: int = 0) -> PutResult:
        views = [_flat(c) for c in chunks]
        size = sum(v.nbytes for v in views)
        if size > self.page_bytes:
            return _MISS
        with self._lock:
            if self._closed:
                return _MISS
            if self._store.is_exist(key) == 1:
                return PutResult(True, False, ())
            staged, h, at = self._staging, xxhash.xxh3_64(), 0
            for v in views:
                staged[at:at + v.nbytes] = np.frombuffer(v, dtype=np.uint8)
                h.update(v)
                at += v.nbytes
            staged[size:size + CHECKSUM_BYTES] = np.frombuffer(h.digest(), dtype=np.uint8)
            rc = self._store.put_from(key, self._ptr, size + CHECKSUM_BYTES, self._config)
            if rc != 0:
                self._counts["put_failures"] += 1
                if self._counts["put_failures"] % 100 == 1:  # a full store fails every put
                    log.warning("Mooncake put failed (%d; %d failures so far): %s", rc,
                                self._counts["put_failures"], key)
                return _MISS
            self._written[key] = tag
            self._written.move_to_end(key)
            if len(self._written) > self.capacity_pages:
                # Older than a full segment: most likely evicted. Reported as gone (an index
                # that forgets a page only predicts less), not probed forever.
                self._forgotten.append(self._written.popitem(last=False)[1])
            self._counts["stores"] += 1
        return PutResult(True, True, ())

    def vanished(self, limit: int) -> list[int]:
        """Tags of the pages this client wrote that the store no longer holds (evicted or
        removed), probing at most ``limit`` of them, the least recently probed first; the
        vanished ones are forgotten, the others go to the back of the queue. Pages pushed out of
        the remembered set (more than ``capacity_pages`` written since) are reported too."""
        with self._lock:
            gone = list(self._forgotten)
            self._forgotten.clear()
            if self._closed:
                return gone
            keys = list(itertools.islice(self._written, max(0, limit)))
            if not keys:
                return gone
            found = self._store.batch_is_exist(keys)
            for key, exists in zip(keys, found, strict=True):
                if exists == 0:
                    gone.append(self._written.pop(key))
                else:  # 1, or an error (<0): kept, probed again next round
                    self._written.move_to_end(key)
            self._counts["vanished"] += len(gone)
            return gone

    def get_into(self, key: str, chunks: Sequence[object]) -> bool:
        views = [_flat(c) for c in chunks]
        size = sum(v.nbytes for v in views)
        with self._lock:
            if size > self.page_bytes or self._closed:
                return self._miss()
            # bytes read, or a negative error (missing key, a dead client's segment, an object
            # of another size than this buffer)
            got = self._store.get_into(key, self._ptr, size + CHECKSUM_BYTES)
            if got != size + CHECKSUM_BYTES:
                return self._miss()
            staged = self._staging
            if self.verify and xxhash.xxh3_64(staged[:size].data).digest() != \
                    staged[size:size + CHECKSUM_BYTES].tobytes():
                self._counts["checksum_failures"] += 1
                self._store.remove(key, True)  # force: past the read lease we just took
                log.warning("Mooncake page %s failed its checksum: removed", key)
                return self._miss()
            at = 0
            for v in views:
                v[:] = staged[at:at + v.nbytes].data
                at += v.nbytes
            self._counts["hits"] += 1
        return True

    def exists(self, key: str) -> bool:
        with self._lock:
            return not self._closed and bool(self._store.is_exist(key) == 1)

    def remove(self, key: str) -> bool:
        with self._lock:
            self._written.pop(key, None)
            return not self._closed and bool(self._store.remove(key, True) == 0)

    def clear(self) -> list[int]:
        """Empty the whole store (every host's pages); the tags of the pages this client wrote
        (what it can name)."""
        with self._lock:
            tags = [*self._written.values(), *self._forgotten]
            self._written.clear()
            self._forgotten.clear()
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
            self._store.unregister_buffer(self._ptr)
            self._store.close()

    def _miss(self) -> bool:  # under the lock
        self._counts["misses"] += 1
        return False
