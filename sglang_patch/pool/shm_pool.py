"""The default L3 pool: pages in shared memory, shared by every worker process of one machine.

Layout under ``<root>/<pool_id>/`` (``root`` defaults to ``/dev/shm/radix-global``):
``lock`` (an ``fcntl.flock`` file), ``meta`` (slot table and key index, see ``shm_meta.py``) and
``seg-<n>`` files of ``slots_per_seg`` fixed-size slots each, memory-mapped by every process.

Why it is safe under concurrent processes: every metadata change happens under the file lock (and
an in-process lock, because ``flock`` does not exclude threads sharing one open file). Page bytes
are copied outside the lock; a reader notes the slot's generation, copies, then re-checks the
generation (bumped by every eviction/removal, before a slot can be reused) and verifies the xxh3
checksum of the bytes it copied. A page evicted, rewritten or corrupted while being read is a miss.

``RADIX_GLOBAL_POOL_NO_VERIFY=1`` turns the checksum verification off. It exists only for the
negative-control test that proves a corrupted page would otherwise reach the engine.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import xxhash

from radix_global.types import PoolId
from sglang_patch.pool import shm_meta as m
from sglang_patch.pool.base import EvictedPage, PagePool, PoolError, PoolStats, PutResult

DEFAULT_ROOT = "/dev/shm/radix-global"
NO_VERIFY_ENV = "RADIX_GLOBAL_POOL_NO_VERIFY"
_SEG_TARGET_BYTES = 256 << 20


def _as_bytes(buf: object) -> memoryview:
    """A flat byte view (no copy); memoryview slice assignment is a plain C memcpy."""
    view = memoryview(buf)  # type: ignore[arg-type]
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _checksum(views: Sequence[memoryview]) -> int:
    h = xxhash.xxh3_64()
    for view in views:
        h.update(view)
    return h.intdigest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ShmPagePool(PagePool):
    """Open (creating if needed) the pool ``pool_id``; every process passes the same geometry."""

    def __init__(
        self,
        pool_id: str,
        page_bytes: int,
        capacity_bytes: int,
        root: str = DEFAULT_ROOT,
    ) -> None:
        if page_bytes < 1 or capacity_bytes < page_bytes:
            raise PoolError(f"need 1 <= page_bytes <= capacity_bytes, got {page_bytes}, "
                            f"{capacity_bytes}")
        if not pool_id or "/" in pool_id:
            raise PoolError(f"pool id must be non-empty without '/', got {pool_id!r}")
        self.pool_id = PoolId(pool_id)
        self.dir = os.path.join(root, pool_id)
        os.makedirs(self.dir, exist_ok=True)
        self._tlock = threading.Lock()
        self._local = threading.local()  # per-thread staging buffer for scattered reads
        self._lock_fd = os.open(os.path.join(self.dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self._verify = os.environ.get(NO_VERIFY_ENV, "") != "1"
        meta_path = os.path.join(self.dir, "meta")
        with self._locked():
            if not os.path.exists(meta_path):
                nslots = capacity_bytes // page_bytes
                per_seg = max(1, min(nslots, _SEG_TARGET_BYTES // page_bytes))
                m.SlotMeta.create(meta_path, nslots, page_bytes, per_seg)
            nslots, have_bytes, per_seg = m.SlotMeta.read_geometry(meta_path)
            if have_bytes != page_bytes:
                raise PoolError(f"pool {pool_id} exists with page_bytes={have_bytes}, "
                                f"asked for {page_bytes}")
            self._meta = m.SlotMeta(meta_path, nslots)
            self._segments: list[memoryview] = [self._map_segment(i, per_seg, page_bytes)
                              for i in range(-(-nslots // per_seg))]
        self.page_bytes = page_bytes
        self.capacity_pages = nslots
        self._per_seg = per_seg

    @classmethod
    def open_existing(cls, pool_id: str, root: str = DEFAULT_ROOT) -> ShmPagePool:
        """Open a pool some other process created, with its geometry (tools and tests)."""
        try:
            nslots, page_bytes, _ = m.SlotMeta.read_geometry(os.path.join(root, pool_id, "meta"))
        except (OSError, ValueError) as exc:
            raise PoolError(f"no pool {pool_id!r} under {root}: {exc}") from exc
        return cls(pool_id, page_bytes, nslots * page_bytes, root)

    def valid_keys_locations(self) -> list[tuple[str, int, int]]:
        """(segment path, offset, length) of every stored page (tests that corrupt the pool)."""
        with self._locked():
            slots = np.flatnonzero(self._meta.slots["state"] == m.VALID)
            out = []
            for slot in slots:
                seg, idx = divmod(int(slot), self._per_seg)
                out.append((os.path.join(self.dir, f"seg-{seg}"), idx * self.page_bytes,
                            int(self._meta.slots["length"][slot])))
            return out

    def _map_segment(self, index: int, per_seg: int, page_bytes: int) -> memoryview:
        path = os.path.join(self.dir, f"seg-{index}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = per_seg * page_bytes
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # sparse on tmpfs: memory is used only when written
            # MAP_POPULATE: map every page now, so no copy pays a page fault per 4 KiB later
            # (the pool's memory is its capacity, allocated once by the first process).
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            return memoryview(mmap.mmap(fd, size, flags=flags))
        finally:
            os.close(fd)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._tlock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _slot_bytes(self, slot: int, length: int) -> memoryview:
        seg, idx = divmod(slot, self._per_seg)
        start = idx * self.page_bytes
        return self._segments[seg][start : start + length]

    # --- PagePool -------------------------------------------------------------------------

    def put(self, key: str, chunks: Sequence[object], tag: int = 0) -> PutResult:
        arrays = [_as_bytes(c) for c in chunks]
        length = sum(len(a) for a in arrays)
        if length > self.page_bytes:
            return PutResult(False, False, ())
        digest = m.key_digest(key)
        checksum = _checksum(arrays)
        evicted: list[EvictedPage] = []
        meta = self._meta
        with self._locked():
            slot = meta.find(digest)
            if slot >= 0 and meta.slots["state"][slot] == m.VALID:
                meta.slots["last_used"][slot] = meta.tick()
                return PutResult(True, False, ())
            slot = self._allocate(evicted)
            if slot < 0:
                return PutResult(False, False, tuple(evicted))
            rec = meta.slots
            rec["gen"][slot] += 1
            rec["state"][slot] = m.WRITING
            rec["length"][slot] = os.getpid()  # lets another process reclaim it if we die
            rec["key"][slot] = digest
        dst = self._slot_bytes(slot, length)
        offset = 0
        for arr in arrays:
            dst[offset : offset + len(arr)] = arr
            offset += len(arr)
        del dst
        with self._locked():
            if meta.find(digest) >= 0:  # another process stored it meanwhile: keep theirs
                rec["state"][slot] = m.FREE
                return PutResult(True, False, tuple(evicted))
            rec["tag"][slot], rec["length"][slot], rec["checksum"][slot] = tag, length, checksum
            rec["last_used"][slot] = meta.tick()
            rec["state"][slot] = m.VALID
            meta.insert(digest, slot)
            meta.bump(m.H_COUNT)
            meta.bump(m.H_STORES)
        return PutResult(True, True, tuple(evicted))

    def _allocate(self, evicted: list[EvictedPage]) -> int:
        meta = self._meta
        slot = meta.free_slot()
        if slot >= 0:
            return slot
        slot = meta.lru_slot()
        if slot >= 0:
            evicted.append(EvictedPage(self._key_hex(slot), int(meta.slots["tag"][slot])))
            meta.delete(meta.slots["key"][slot].copy(), slot)
            meta.slots["gen"][slot] += 1
            meta.slots["state"][slot] = m.FREE
            meta.bump(m.H_COUNT, -1)
            meta.bump(m.H_EVICTIONS)
            return slot
        for writing in np.flatnonzero(meta.slots["state"] == m.WRITING):  # writers that died
            if not _pid_alive(int(meta.slots["length"][writing])):
                return int(writing)
        return -1

    def _key_hex(self, slot: int) -> str:
        """Evicted pages are reported by digest: the original key string is not stored."""
        return bytes(self._meta.slots["key"][slot]).hex()

    def get_into(self, key: str, chunks: Sequence[object]) -> bool:
        arrays = [_as_bytes(c) for c in chunks]
        length = sum(len(a) for a in arrays)
        meta = self._meta
        with self._locked():
            slot = meta.find(m.key_digest(key))
            if slot < 0 or meta.slots["state"][slot] != m.VALID or (
                    int(meta.slots["length"][slot]) != length):
                meta.bump(m.H_MISSES)
                return False
            gen = int(meta.slots["gen"][slot])
            checksum = int(meta.slots["checksum"][slot])
            meta.slots["last_used"][slot] = meta.tick()
        # A scattered destination is filled through a private staging buffer: one big copy out
        # of shared memory then small private copies measured ~3x faster than many small reads
        # of shared memory (benchmarks/pool_bench.py), and the engine never sees unverified bytes.
        staged = [self._staging(length)] if len(arrays) > 1 else arrays
        self._copy_out(self._slot_bytes(slot, length), staged)
        if int(meta.slots["gen"][slot]) != gen or meta.slots["state"][slot] != m.VALID:
            with self._locked():
                meta.bump(m.H_MID_READ)
                meta.bump(m.H_MISSES)
            return False
        if self._verify and _checksum(staged) != checksum:
            with self._locked():
                meta.bump(m.H_BAD_SUM)
                meta.bump(m.H_MISSES)
                self._remove_slot_if(slot, gen)  # a corrupt page must not be served again
            return False
        if staged is not arrays:
            self._copy_out(staged[0], arrays)
        with self._locked():
            meta.bump(m.H_HITS)
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

    def _remove_slot_if(self, slot: int, gen: int) -> bool:
        meta = self._meta
        if int(meta.slots["gen"][slot]) != gen or meta.slots["state"][slot] != m.VALID:
            return False
        meta.delete(meta.slots["key"][slot].copy(), slot)
        meta.slots["gen"][slot] += 1
        meta.slots["state"][slot] = m.FREE
        meta.bump(m.H_COUNT, -1)
        return True

    def exists(self, key: str) -> bool:
        with self._locked():
            slot = self._meta.find(m.key_digest(key))
            return slot >= 0 and self._meta.slots["state"][slot] == m.VALID

    def remove(self, key: str) -> bool:
        with self._locked():
            slot = self._meta.find(m.key_digest(key))
            return slot >= 0 and self._remove_slot_if(slot, int(self._meta.slots["gen"][slot]))

    def clear(self) -> list[int]:
        with self._locked():
            slots = np.flatnonzero(self._meta.slots["state"] == m.VALID)
            tags = [int(self._meta.slots["tag"][s]) for s in slots]
            for s in slots:
                self._remove_slot_if(int(s), int(self._meta.slots["gen"][s]))
        return tags

    def stats(self) -> PoolStats:
        with self._locked():
            h = [int(x) for x in self._meta.header]
        return PoolStats(self.pool_id, h[m.H_COUNT], self.capacity_pages, self.page_bytes,
                         h[m.H_STORES], h[m.H_HITS], h[m.H_MISSES], h[m.H_EVICTIONS],
                         h[m.H_BAD_SUM], h[m.H_MID_READ])

    def close(self) -> None:
        self._segments = []
        self._meta.close()
        os.close(self._lock_fd)

    # --- for tests and tools --------------------------------------------------------------

    def locate(self, key: str) -> tuple[str, int, int] | None:
        """(segment file path, byte offset, length) of a stored page, or None. For tests/tools
        that inspect or deliberately corrupt pages from outside."""
        with self._locked():
            slot = self._meta.find(m.key_digest(key))
            if slot < 0 or self._meta.slots["state"][slot] != m.VALID:
                return None
            seg, idx = divmod(slot, self._per_seg)
            return (os.path.join(self.dir, f"seg-{seg}"), idx * self.page_bytes,
                    int(self._meta.slots["length"][slot]))


def destroy_pool(pool_id: str, root: str = DEFAULT_ROOT) -> None:
    """Delete a pool's files (its memory is freed once every process has closed it)."""
    path = os.path.join(root, pool_id)
    if os.path.isdir(path):
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)
