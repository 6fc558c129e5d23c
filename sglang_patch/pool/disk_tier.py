"""A persistent page tier on a local folder, under the memory pool (``docs/interfaces.md`` s. 16).

One file per page, ``DIR/<2 hex>/<SHA-256 of the pool key>.page``: a checksummed header (the
page's tag and its parent's, tokens per page, the pool key) and the page's bytes with their own
checksum. Writes go to a temporary file in the same folder, are synced and renamed, so a reader
never sees a torn page and a killed writer leaves only a temporary file, deleted at the next open.
A damaged or truncated file is a miss and is removed. Capacity: LRU by modification time (a read
touches the file), counted by this process over what the scan at open found.

Thread-safe: SGLang's prefetch and backup threads call the backend at once.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
import struct
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import xxhash

log = logging.getLogger(__name__)

MAGIC = b"RGDK"
VERSION = 1
# magic, version, payload length, payload xxh3, tag, parent tag, has parent, tokens/page, key len
_HEAD = struct.Struct("<4sHQQqqBIH")
_HEAD_SUM = struct.Struct("<Q")
SUFFIX = ".page"
TMP_PREFIX = ".tmp-"


class DiskPage(NamedTuple):
    """What the header of one page file says (for announcing the tier after a restart)."""

    key: str  # the pool key: "<namespace>/<digest>[/shard]"
    tag: int
    parent: int | None
    page_size: int
    nbytes: int


def file_stem(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _buffers(chunks: Sequence[object]) -> list[memoryview]:
    return [memoryview(c).cast("B") for c in chunks]  # type: ignore[arg-type]


class DiskTier:
    """A bounded folder of page files; see the module docstring."""

    def __init__(self, root: str | os.PathLike[str], capacity_bytes: int) -> None:
        if capacity_bytes < 1:
            raise ValueError("the disk tier needs a positive capacity")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._lru: collections.OrderedDict[str, int] = collections.OrderedDict()  # name -> size
        self._used = 0
        self.corrupt = 0
        self._scan()

    def _path(self, name: str) -> Path:
        return self.root / name[:2] / (name + SUFFIX)

    def _scan(self) -> None:
        """Index what the folder holds, oldest first; delete what killed writers left."""
        found: list[tuple[float, str, int]] = []
        for sub in self.root.iterdir() if self.root.is_dir() else ():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f.name.startswith(TMP_PREFIX):
                    with contextlib.suppress(OSError):
                        f.unlink()
                elif f.name.endswith(SUFFIX):
                    with contextlib.suppress(OSError):
                        st = f.stat()
                        found.append((st.st_mtime, f.name[: -len(SUFFIX)], st.st_size))
        for _, name, size in sorted(found):
            self._lru[name] = size
            self._used += size

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def used_bytes(self) -> int:
        return self._used

    def exists(self, key: str) -> bool:
        with self._lock:
            return file_stem(key) in self._lru

    def write(self, key: str, chunks: Sequence[object], tag: int, parent: int | None,
              page_size: int) -> tuple[bool, list[int]]:
        """Store the page (``new``: it was not on disk) and the tags of the pages evicted to
        make room for it. A page that exists is only touched (same bytes: same key)."""
        name = file_stem(key)
        with self._lock:
            if name in self._lru:
                self._lru.move_to_end(name)
                with contextlib.suppress(OSError):
                    os.utime(self._path(name))
                return False, []
        views = _buffers(chunks)
        payload_len = sum(v.nbytes for v in views)
        h = xxhash.xxh3_64()
        for v in views:
            h.update(v)
        kb = key.encode()
        head = _HEAD.pack(MAGIC, VERSION, payload_len, h.intdigest(), tag,
                          0 if parent is None else parent, parent is not None, page_size,
                          len(kb)) + kb
        head += _HEAD_SUM.pack(xxhash.xxh3_64_intdigest(head))
        path = self._path(name)
        path.parent.mkdir(exist_ok=True)
        tmp = path.parent / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                for v in views:
                    f.write(v)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.warning("radix-global: disk tier write failed: %r", exc)
            return False, []
        size = len(head) + payload_len
        with self._lock:
            self._used += size - self._lru.get(name, 0)  # another thread may have written it
            self._lru[name] = size
            self._lru.move_to_end(name)
            return True, self._evict()

    def _evict(self) -> list[int]:
        tags = []
        while self._used > self.capacity_bytes and len(self._lru) > 1:
            name, size = self._lru.popitem(last=False)
            self._used -= size
            page = self._read_head(self._path(name))
            with contextlib.suppress(OSError):
                self._path(name).unlink()
            if page is not None:
                tags.append(page.tag)
        return tags

    def read_into(self, key: str, chunks: Sequence[object]) -> bool:
        """Fill ``chunks`` with the page; False (and the file removed) for a missing, short,
        foreign or damaged one."""
        name = file_stem(key)
        path = self._path(name)
        views = _buffers(chunks)
        want = sum(v.nbytes for v in views)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            self._forget(name)
            return False
        page = _parse_head(data)
        if page is None or page.key != key or page.nbytes != want:
            self._damaged(name, path)
            return False
        body = memoryview(data)[len(data) - want:]
        if xxhash.xxh3_64_intdigest(body) != _HEAD.unpack_from(data)[3]:
            self._damaged(name, path)
            return False
        off = 0
        for v in views:
            v[:] = body[off : off + v.nbytes]
            off += v.nbytes
        with self._lock:
            if name in self._lru:
                self._lru.move_to_end(name)
        with contextlib.suppress(OSError):
            os.utime(path)
        return True

    def _damaged(self, name: str, path: Path) -> None:
        self.corrupt += 1
        log.warning("radix-global: disk tier page %s is damaged: removed", path)
        with contextlib.suppress(OSError):
            path.unlink()
        self._forget(name)

    def _forget(self, name: str) -> None:
        with self._lock:
            size = self._lru.pop(name, None)
            if size is not None:
                self._used -= size

    def remove(self, key: str) -> bool:
        name = file_stem(key)
        with contextlib.suppress(OSError):
            self._path(name).unlink()
        with self._lock:
            size = self._lru.pop(name, None)
            if size is not None:
                self._used -= size
            return size is not None

    def pages(self) -> list[DiskPage]:
        """The header of every page on disk (damaged ones skipped), for announcing the tier."""
        with self._lock:
            names = list(self._lru)
        out = []
        for name in names:
            page = self._read_head(self._path(name))
            if page is not None:
                out.append(page)
        return out

    @staticmethod
    def _read_head(path: Path) -> DiskPage | None:
        try:
            with open(path, "rb") as f:
                head = f.read(_HEAD.size + 65536 + _HEAD_SUM.size)
        except OSError:
            return None
        return _parse_head(head, whole=False)


def _parse_head(data: bytes, whole: bool = True) -> DiskPage | None:
    if len(data) < _HEAD.size:
        return None
    magic, version, nbytes, _sum, tag, parent, has_parent, page_size, klen = _HEAD.unpack_from(data)
    end = _HEAD.size + klen
    if magic != MAGIC or version != VERSION or len(data) < end + _HEAD_SUM.size:
        return None
    (head_sum,) = _HEAD_SUM.unpack_from(data, end)
    if head_sum != xxhash.xxh3_64_intdigest(data[:end]):
        return None
    if whole and len(data) != end + _HEAD_SUM.size + nbytes:
        return None  # truncated (or grown): the payload is not what the header says
    try:
        key = data[_HEAD.size : end].decode()
    except UnicodeDecodeError:
        return None
    return DiskPage(key, tag, parent if has_parent else None, page_size, nbytes)


def read_bandwidth_Bps(root: str | os.PathLike[str], nbytes: int = 32 << 20) -> float:
    """Bytes per second a cold read of ``root``'s device gives: a file written, synced, dropped
    from the page cache (where the kernel lets us) and read back. On a memory file system it is
    memory speed, which is what such a tier reads at."""
    path = Path(root) / f"{TMP_PREFIX}bandwidth-{os.getpid()}"
    block = os.urandom(1 << 20)
    try:
        with open(path, "wb") as f:
            for _ in range(max(1, nbytes >> 20)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
            with contextlib.suppress(AttributeError, OSError):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            got = 0
            while chunk := f.read(1 << 20):
                got += len(chunk)
        elapsed = max(time.perf_counter() - t0, 1e-6)
        return got / elapsed
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
