"""The files of one shared-memory pool, and how a process attaches to them and repairs them.

Layout under ``<root>/<pool_id>/``: ``lock`` (an ``fcntl.flock`` file), ``meta`` (slot table and
key index, ``shm_meta.py``) and ``seg-<n>`` files of ``per_seg`` fixed-size slots each, mapped by
every process. :class:`PoolFiles` owns this process's handles on them.

Damage (``PoolCorrupt``) is repaired by :meth:`PoolFiles.reset`, under the lock, *in place*: the
meta file keeps its inode, so every process that has it mapped sees the emptied pool at once (a
rebuilt-and-renamed file would leave them on the old one, each believing different slots valid).
A process that finds the pool rebuilt with another geometry, or the meta file replaced, attaches
to the new one instead of resetting it back (two geometries would otherwise reset each other
forever). Files truncated under a mapping are grown back to their size before any access:
reading a mapped page past the end of its file is a SIGBUS, which nothing could catch.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import threading

import numpy as np

from sglang_patch.pool import shm_meta as m
from sglang_patch.pool.base import CorruptReason, EvictedPage, PoolCorrupt, PoolError

log = logging.getLogger(__name__)


def read_header(path: str) -> tuple[m.Geometry | None, int]:
    """(geometry, file size) of a meta file. The geometry is None unless the header is a valid
    one of this version whose size matches the file; the size is -1 when there is no file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, -1
    try:
        size = os.fstat(fd).st_size
        raw = os.pread(fd, m.HEADER_WORDS * 8, 0)
    finally:
        os.close(fd)
    if len(raw) < m.HEADER_WORDS * 8:
        return None, size
    header = np.frombuffer(raw, dtype="<u8")
    geom = m.Geometry(int(header[m.H_NSLOTS]), int(header[m.H_PAGE_BYTES]),
                      int(header[m.H_SLOTS_PER_SEG]))
    if (not geom.plausible() or m.meta_bytes(geom.nslots) != size
            or not np.array_equal(m.geometry_words(header), geom.words())):
        return None, size
    return geom, size


def geometry_of_size(size: int, page_bytes: int) -> m.Geometry | None:
    """The geometry whose meta file has exactly ``size`` bytes, if any: lets a process that finds
    a damaged header rebuild the pool with the geometry the other processes have mapped."""
    lo, hi = 1, max(1, size // m.SLOT_DTYPE.itemsize)
    while lo <= hi:  # meta_bytes is strictly increasing in nslots
        mid = (lo + hi) // 2
        have = m.meta_bytes(mid)
        if have == size:
            return m.Geometry.for_capacity(page_bytes, mid * page_bytes)
        lo, hi = (mid + 1, hi) if have < size else (lo, mid - 1)
    return None


class _Lock:
    """The pool lock as a plain context manager (it is taken twice per operation: a generator
    context manager costs microseconds each). Not re-entrant."""

    def __init__(self, files: PoolFiles) -> None:
        self._files = files

    def __enter__(self) -> None:
        # flock does not exclude threads sharing one open file: the thread lock does
        self._files.tlock.acquire()
        try:
            fcntl.flock(self._files.lock_fd, fcntl.LOCK_EX)
        except BaseException:
            self._files.tlock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._files.lock_fd, fcntl.LOCK_UN)
        finally:
            self._files.tlock.release()


class _Guard(_Lock):
    """The lock, then the meta file's size and geometry checked before anything reads it."""

    def __enter__(self) -> m.SlotMeta:  # type: ignore[override]
        super().__enter__()
        try:
            meta = self._files.meta
            meta.check()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return meta


class PoolFiles:
    """Lock, meta mapping and segment mappings of the pool in ``directory`` (created if needed
    with geometry ``asked``; an existing pool keeps its own slot count)."""

    def __init__(self, directory: str, asked: m.Geometry) -> None:
        self.dir = directory
        self.asked = asked
        self.resets = 0  # resets done by this process (the shared count is in the header)
        self._meta_path = os.path.join(directory, "meta")
        self.tlock = threading.Lock()
        self.lock_fd = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self._lock, self._guard = _Lock(self), _Guard(self)
        self._meta: m.SlotMeta | None = None
        self._seg_fds: list[int] = []
        self.segments: list[memoryview] = []
        with self.locked():
            self._attach()
            try:
                self.meta.validate()
                self._check_segments()
            except PoolCorrupt as exc:
                self.reset(exc)

    @property
    def meta(self) -> m.SlotMeta:
        if self._meta is None:
            raise PoolError("pool is closed")
        return self._meta

    @property
    def geom(self) -> m.Geometry:
        return self.meta.geom

    def locked(self) -> _Lock:
        return self._lock

    def guarded(self) -> _Guard:
        """``with files.guarded() as meta``: the lock, with the meta file checked (``check``)."""
        return self._guard

    # --- attaching -------------------------------------------------------------------------

    def _attach(self) -> None:
        """Map meta and segments (lock held): create the pool, rebuild a damaged header, or take
        the geometry of the pool that is there."""
        geom, size = read_header(self._meta_path)
        if geom is None and size < 0:
            geom = self.asked
            m.SlotMeta.create(self._meta_path, geom)
        elif geom is None:
            # the slot count the other processes mapped, if the file size still says it
            geom = geometry_of_size(size, self.asked.page_bytes) or self.asked
            log.warning("pool %s: meta header damaged; rebuilding it empty (%d slots)",
                        self.dir, geom.nslots)
            os.truncate(self._meta_path, m.meta_bytes(geom.nslots))
            fresh = m.SlotMeta(self._meta_path, geom)
            fresh.format(count_reset=True)
            fresh.close()
            self.resets += 1
        elif geom.page_bytes != self.asked.page_bytes:
            raise PoolError(f"pool {os.path.basename(self.dir)} exists with "
                            f"page_bytes={geom.page_bytes}, asked for {self.asked.page_bytes}")
        self._detach()
        self._meta = m.SlotMeta(self._meta_path, geom)
        for index in range(geom.nsegments):
            fd, view = self._map_segment(index, geom.per_seg * geom.page_bytes)
            self._seg_fds.append(fd)
            self.segments.append(view)

    def _map_segment(self, index: int, size: int) -> tuple[int, memoryview]:
        fd = os.open(os.path.join(self.dir, f"seg-{index}"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # sparse on tmpfs: memory is used only when written
            # MAP_POPULATE: map every page now, so no copy pays a page fault per 4 KiB later
            # (the pool's memory is its capacity, allocated once by the first process).
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            return fd, memoryview(mmap.mmap(fd, size, flags=flags))
        except BaseException:
            os.close(fd)
            raise

    def _detach(self) -> None:
        # mappings still viewed by a copy in flight are unmapped by the GC once it is done
        self.segments = []
        for fd in self._seg_fds:
            os.close(fd)
        self._seg_fds = []
        if self._meta is not None:
            self._meta.close()
            self._meta = None

    def close(self) -> None:
        self._detach()
        os.close(self.lock_fd)

    # --- guards and repair -------------------------------------------------------------------

    def check_segment(self, seg: int) -> None:
        """Raise PoolCorrupt if segment ``seg`` is shorter than its mapping (call before copying
        to or from it: a page past the end of the file is a SIGBUS)."""
        size = os.fstat(self._seg_fds[seg]).st_size
        want = self.geom.per_seg * self.geom.page_bytes
        if size < want:
            raise PoolCorrupt(CorruptReason.SHORT_FILE, f"seg-{seg} is {size} bytes, mapped {want}")

    def _check_segments(self) -> None:
        for seg in range(len(self._seg_fds)):
            self.check_segment(seg)

    def recover(self, exc: PoolCorrupt) -> list[EvictedPage]:
        """Take the lock and :meth:`reset` (what public operations call on PoolCorrupt)."""
        with self.locked():
            return self.reset(exc)

    def reset(self, exc: PoolCorrupt) -> list[EvictedPage]:
        """Repair the pool after ``exc`` (lock held): follow a rebuilt or replaced pool, or do
        nothing if another process repaired it already, else empty it in place. Returns the
        pages dropped that could still be named."""
        geom, _ = read_header(self._meta_path)
        with contextlib.suppress(OSError):
            replaced = os.stat(self._meta_path).st_ino != self.meta.inode()
            # (another page size: a process with another config rebuilt a damaged pool; the pool
            # is ours again below, as a config mismatch is refused at open)
            if (geom is not None and geom.page_bytes == self.asked.page_bytes
                    and (geom != self.geom or replaced)):
                log.warning("pool %s: rebuilt by another process (%s); attaching to it",
                            self.dir, exc)
                self._attach()
        try:
            self.meta.validate()
            self._check_segments()
            return []  # repaired meanwhile (by another process, or by the attach above)
        except PoolCorrupt as found:
            exc = found
        size = self.geom.per_seg * self.geom.page_bytes
        self.meta.grow()  # truncated files grow back before format() writes through the maps
        for fd in self._seg_fds:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
        dropped = self.meta.format(count_reset=True)
        self.resets += 1
        log.warning("pool %s: %s; reset it, %d pages dropped", self.dir, exc, len(dropped))
        return [EvictedPage(key_hex, tag) for key_hex, tag in dropped]
