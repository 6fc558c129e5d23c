"""The default L3 pool: pages in shared memory, shared by every worker process of one machine.

Files under ``<root>/<pool_id>/`` (``root`` defaults to ``/dev/shm/radix-global``): see
``shm_files.py`` (lock, ``meta``, ``seg-<n>``) and ``shm_meta.py`` (the slot table and key index).

Why it is safe under concurrent processes: every metadata change happens under the file lock (and
an in-process lock, because ``flock`` does not exclude threads sharing one open file). Page bytes
are copied outside the lock; a reader notes the slot's generation, copies, then re-checks the
generation (bumped by every eviction/removal/reclaim/reset, before a slot can be reused) and
verifies the xxh3 checksum of the bytes it copied. A page evicted, rewritten or corrupted while
being read is a miss. A writer commits only if its slot's generation is still the one it set: a
slot taken back from it meanwhile (``liveness.py``: dead writer or expired lease) stays free.

Why it survives its own processes: a writer killed mid-copy leaves its slot WRITING; each process
frees such slots whose writer is dead or out of lease (``liveness.py``) at its first allocation
every ``SWEEP_INTERVAL_S``, and at once when no slot is free or evictable. Damaged shared state
raises ``PoolCorrupt`` inside; each public operation catches it, resets the pool
(``shm_files.py``) and answers a miss.

``RADIX_GLOBAL_POOL_NO_VERIFY=1`` turns the checksum verification off. It exists only for the
negative-control test that proves a corrupted page would otherwise reach the engine.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

import numpy as np
import xxhash

from radix_global.types import PoolId
from sglang_patch.pool import liveness as lv
from sglang_patch.pool import shm_meta as m
from sglang_patch.pool.base import (
    EvictedPage,
    PagePool,
    PoolCorrupt,
    PoolError,
    PoolStats,
    PutResult,
    as_bytes,
)
from sglang_patch.pool.shm_files import PoolFiles, read_header

DEFAULT_ROOT = "/dev/shm/radix-global"
NO_VERIFY_ENV = "RADIX_GLOBAL_POOL_NO_VERIFY"
log = logging.getLogger(__name__)
_MISS = PutResult(False, False, ())


def _checksum(views: Sequence[memoryview]) -> int:
    h = xxhash.xxh3_64()
    for view in views:
        h.update(view)
    return h.intdigest()


class ShmPagePool(PagePool):
    """Open (creating if needed) the pool ``pool_id``; every process passes the same page size
    (an existing pool keeps its capacity). ``write_lease_s``: see ``liveness.py``."""

    def __init__(
        self,
        pool_id: str,
        page_bytes: int,
        capacity_bytes: int,
        root: str = DEFAULT_ROOT,
        write_lease_s: float = lv.WRITE_LEASE_S,
    ) -> None:
        if page_bytes < 1 or capacity_bytes < page_bytes:
            raise PoolError(f"need 1 <= page_bytes <= capacity_bytes, got {page_bytes}, "
                            f"{capacity_bytes}")
        if not pool_id or "/" in pool_id:
            raise PoolError(f"pool id must be non-empty without '/', got {pool_id!r}")
        self.pool_id = PoolId(pool_id)
        self.dir = os.path.join(root, pool_id)
        os.makedirs(self.dir, exist_ok=True)
        self._local = threading.local()  # per-thread staging buffer for scattered reads
        self._verify = os.environ.get(NO_VERIFY_ENV, "") != "1"
        self._sweeper = lv.StaleWriterSweeper(pool_id, write_lease_s)
        self._files = PoolFiles(self.dir, m.Geometry.for_capacity(page_bytes, capacity_bytes))
        self.page_bytes = page_bytes

    @property
    def capacity_pages(self) -> int:  # type: ignore[override]
        return self._files.geom.nslots

    @property
    def resets(self) -> int:
        """Resets this process did (``stats().resets`` counts every process's)."""
        return self._files.resets

    @classmethod
    def open_existing(cls, pool_id: str, root: str = DEFAULT_ROOT) -> ShmPagePool:
        """Open a pool some other process created, with its geometry (tools and tests)."""
        geom, size = read_header(os.path.join(root, pool_id, "meta"))
        if geom is None:
            why = "no meta file" if size < 0 else "damaged meta header"
            raise PoolError(f"no pool {pool_id!r} under {root}: {why}")
        return cls(pool_id, geom.page_bytes, geom.nslots * geom.page_bytes, root)

    def _slot_bytes(self, slot: int, length: int) -> memoryview:
        seg, idx = divmod(slot, self._files.geom.per_seg)
        start = idx * self.page_bytes
        return self._files.segments[seg][start : start + length]

    def _location(self, meta: m.SlotMeta, slot: int) -> tuple[str, int, int]:
        seg, idx = divmod(slot, meta.geom.per_seg)
        return (os.path.join(self.dir, f"seg-{seg}"), idx * self.page_bytes,
                int(meta.slots["length"][slot]))

    # --- PagePool -------------------------------------------------------------------------

    def put(self, key: str, chunks: Sequence[object], tag: int = 0) -> PutResult:
        evicted: list[EvictedPage] = []
        try:
            return self._put(key, [as_bytes(c) for c in chunks], tag, evicted)
        except PoolCorrupt as exc:
            return PutResult(False, False, (*evicted, *self._files.recover(exc)))

    def _put(self, key: str, arrays: list[memoryview], tag: int,
             evicted: list[EvictedPage]) -> PutResult:
        length = sum(len(a) for a in arrays)
        if length > self.page_bytes:
            return _MISS
        digest = m.key_digest(key)
        checksum = _checksum(arrays)
        with self._files.guarded() as meta:
            slot = meta.find(digest)
            if slot >= 0 and meta.slots["state"][slot] == m.VALID:
                meta.slots["last_used"][slot] = meta.tick()
                return PutResult(True, False, ())
            slot = self._allocate(meta, evicted)
            if slot < 0:
                return PutResult(False, False, tuple(evicted))
            gen = meta.bump_gen(slot)
            rec, me = meta.slots, lv.current_writer()
            rec["state"][slot] = m.WRITING
            rec["key"][slot] = digest
            rec["writer"][slot], rec["writer_start"][slot], rec["writer_ns"][slot] = me
            rec["writing_since"][slot] = lv.now_ns()
            self._files.check_segment(slot // meta.geom.per_seg)
            dst = self._slot_bytes(slot, length)  # of this geometry, even if another thread
        self._copy_in(dst, arrays)  # attaches the pool to a rebuilt one meanwhile
        del dst
        with self._files.guarded() as meta:
            rec = meta.slots
            if int(rec["gen"][slot]) != gen or rec["state"][slot] != m.WRITING:
                return PutResult(False, False, tuple(evicted))  # taken back: lease or reset
            other = meta.find(digest)  # (a damaged index may point at our own slot)
            if other >= 0 and other != slot and rec["state"][other] == m.VALID:
                rec["state"][slot] = m.FREE  # another process stored it meanwhile: keep theirs
                return PutResult(True, False, tuple(evicted))
            rec["tag"][slot], rec["length"][slot], rec["checksum"][slot] = tag, length, checksum
            rec["last_used"][slot] = meta.tick()
            rec["state"][slot] = m.VALID
            meta.insert(digest, slot)
            meta.bump(m.H_COUNT)
            meta.bump(m.H_STORES)
        return PutResult(True, True, tuple(evicted))

    @staticmethod
    def _copy_in(dst: memoryview, arrays: Sequence[memoryview]) -> None:
        offset = 0
        for arr in arrays:
            dst[offset : offset + len(arr)] = arr
            offset += len(arr)

    def _allocate(self, meta: m.SlotMeta, evicted: list[EvictedPage]) -> int:
        self._sweeper.sweep_if_due(meta)  # dead writers' slots come back within the interval
        slot = meta.free_slot()
        if slot >= 0:
            return slot
        slot = meta.lru_slot()
        if slot < 0:  # every slot is WRITING (or damaged): look now
            return meta.free_slot() if self._sweeper.sweep(meta) else -1
        evicted.append(EvictedPage(bytes(meta.slots["key"][slot]).hex(),
                                   int(meta.slots["tag"][slot])))
        meta.delete(meta.slots["key"][slot].copy(), slot)
        meta.bump_gen(slot)
        meta.slots["state"][slot] = m.FREE
        meta.bump(m.H_COUNT, -1)
        meta.bump(m.H_EVICTIONS)
        return slot

    def get_into(self, key: str, chunks: Sequence[object]) -> bool:
        try:
            return self._get_into(key, [as_bytes(c) for c in chunks])
        except PoolCorrupt as exc:
            self._files.recover(exc)
            return False

    def _get_into(self, key: str, arrays: list[memoryview]) -> bool:
        length = sum(len(a) for a in arrays)
        with self._files.guarded() as meta:
            slot = meta.find(m.key_digest(key))
            # length <= page_bytes: a damaged stored length never makes a copy run off the slot
            if length > self.page_bytes or slot < 0 or meta.slots["state"][slot] != m.VALID or (
                    int(meta.slots["length"][slot]) != length):
                meta.bump(m.H_MISSES)
                return False
            gen = int(meta.slots["gen"][slot])
            checksum = int(meta.slots["checksum"][slot])
            meta.slots["last_used"][slot] = meta.tick()
            self._files.check_segment(slot // meta.geom.per_seg)
            src = self._slot_bytes(slot, length)
        # A scattered destination is filled through a private staging buffer: one big copy out
        # of shared memory then small private copies measured ~3x faster than many small reads
        # of shared memory (benchmarks/micro/pool_bench.py), and the engine never sees unverified
        # bytes.
        staged = [self._staging(length)] if len(arrays) > 1 else arrays
        self._copy_out(src, staged)
        del src
        intact = not self._verify or _checksum(staged) == checksum
        # re-checked under the lock: the meta file is only ever read after check() there
        with self._files.guarded() as meta:
            if int(meta.slots["gen"][slot]) != gen or meta.slots["state"][slot] != m.VALID:
                meta.bump(m.H_MID_READ)
                meta.bump(m.H_MISSES)
                return False
            if not intact:
                meta.bump(m.H_BAD_SUM)
                meta.bump(m.H_MISSES)
                self._remove_slot_if(meta, slot, gen)  # a corrupt page must not be served again
                return False
            meta.bump(m.H_HITS)
        if staged is not arrays:
            self._copy_out(staged[0], arrays)
        return True

    def _staging(self, length: int) -> memoryview:
        buf = getattr(self._local, "staging", None)
        if buf is None or len(buf) < length:
            buf = self._local.staging = memoryview(bytearray(self.page_bytes))
        return buf[:length]

    @staticmethod
    def _copy_out(src: memoryview, views: Sequence[memoryview]) -> None:
        offset = 0
        for view in views:
            view[:] = src[offset : offset + len(view)]
            offset += len(view)

    @staticmethod
    def _remove_slot_if(meta: m.SlotMeta, slot: int, gen: int) -> bool:
        if int(meta.slots["gen"][slot]) != gen or meta.slots["state"][slot] != m.VALID:
            return False
        meta.delete(meta.slots["key"][slot].copy(), slot)
        meta.bump_gen(slot)
        meta.slots["state"][slot] = m.FREE
        meta.bump(m.H_COUNT, -1)
        return True

    def exists(self, key: str) -> bool:
        try:
            with self._files.guarded() as meta:
                slot = meta.find(m.key_digest(key))
                return slot >= 0 and meta.slots["state"][slot] == m.VALID
        except PoolCorrupt as exc:
            self._files.recover(exc)
            return False

    def remove(self, key: str) -> bool:
        try:
            with self._files.guarded() as meta:
                slot = meta.find(m.key_digest(key))
                return slot >= 0 and self._remove_slot_if(meta, slot,
                                                          int(meta.slots["gen"][slot]))
        except PoolCorrupt as exc:
            self._files.recover(exc)
            return False

    def clear(self) -> list[int]:
        try:
            with self._files.guarded() as meta:
                slots = np.flatnonzero(meta.slots["state"] == m.VALID)
                tags = [int(meta.slots["tag"][s]) for s in slots]
                for s in slots:
                    self._remove_slot_if(meta, int(s), int(meta.slots["gen"][s]))
            return tags
        except PoolCorrupt as exc:
            return [page.tag for page in self._files.recover(exc)]

    def stats(self) -> PoolStats:
        for attempt in (0, 1):
            try:
                with self._files.guarded() as meta:
                    h = [int(x) for x in meta.header]
                break
            except PoolCorrupt as exc:
                self._files.recover(exc)
                if attempt:
                    raise
        return PoolStats(self.pool_id, h[m.H_COUNT], self.capacity_pages, self.page_bytes,
                         h[m.H_STORES], h[m.H_HITS], h[m.H_MISSES], h[m.H_EVICTIONS],
                         h[m.H_BAD_SUM], h[m.H_MID_READ], h[m.H_RESETS], h[m.H_RECLAIMED])

    def close(self) -> None:
        self._files.close()

    # --- for tests and tools --------------------------------------------------------------

    def locate(self, key: str) -> tuple[str, int, int] | None:
        """(segment file path, byte offset, length) of a stored page, or None. For tests/tools
        that inspect or deliberately corrupt pages from outside."""
        with self._files.guarded() as meta:
            slot = meta.find(m.key_digest(key))
            if slot < 0 or meta.slots["state"][slot] != m.VALID:
                return None
            return self._location(meta, slot)

    def valid_keys_locations(self) -> list[tuple[str, int, int]]:
        """(segment path, offset, length) of every stored page (tests that corrupt the pool)."""
        with self._files.guarded() as meta:
            return [self._location(meta, int(slot))
                    for slot in np.flatnonzero(meta.slots["state"] == m.VALID)]


def destroy_pool(pool_id: str, root: str = DEFAULT_ROOT) -> None:
    """Delete a pool's files (its memory is freed once every process has closed it)."""
    path = os.path.join(root, pool_id)
    if os.path.isdir(path):
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)
