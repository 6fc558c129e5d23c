"""A persistent page tier on a local folder, under the memory pool (``docs/interfaces.md``,
"The persistent disk tier under the pool").

One file per page, ``DIR/<2 hex>/<SHA-256 of the pool key>.page``: a checksummed header (the
page's tag and its parent's, tokens per page, the pool key) and the page's bytes with their own
checksum. Writes go to a temporary file in the same folder, are synced, renamed and the folder
synced, so a reader never sees a torn page, a killed writer leaves only a temporary file (deleted
at the next open), and a page announced as stored survives a power loss.
A damaged or truncated file is a miss and is removed. Capacity: LRU by modification time (a read
touches the file), counted by this process over what the scan at open found.

Who may write the folder (``sglang_patch/pool/disk_folder.py``): checksums guard against
damage, not against a forger. At open a folder that others may write raises
``UnsafeDiskFolder``, and the scan removes page files that others could have rewritten.

Thread-safe: SGLang's prefetch and backup threads call the backend at once.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import stat
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import xxhash

from sglang_patch.pool.disk_folder import FILE_MODE, FOLDER_MODE, check_folder
from sglang_patch.pool.disk_format import (
    SUFFIX,
    TMP_PREFIX,
    DiskPage,
    buffers,
    file_stem,
    max_file_bytes,
    pack_head,
    parse_head,
    payload_sum,
    read_head,
)

log = logging.getLogger(__name__)


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteResult(NamedTuple):
    on_disk: bool  # the page is on disk now (written, or there already)
    new: bool  # this call wrote it
    evicted: list[int]  # tags of the pages removed to make room for it


def _writer_alive(name: str) -> bool:
    """Whether the process that owns a temporary file (its pid is in the name) still runs."""
    try:
        pid = int(name[len(TMP_PREFIX):].split("-")[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


class DiskTier:
    """A bounded folder of page files; see the module docstring."""

    def __init__(self, root: str | os.PathLike[str], capacity_bytes: int) -> None:
        if capacity_bytes < 1:
            raise ValueError("the disk tier needs a positive capacity")
        check_folder(root)
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        # name -> (size, tag); oldest first. The tag is known for what this process wrote or
        # read; files found by the scan get theirs when first needed (None until then).
        self._lru: collections.OrderedDict[str, tuple[int, int | None]] = (
            collections.OrderedDict())
        self._used = 0
        self.corrupt = 0
        self._scan()

    def _path(self, name: str) -> Path:
        return self.root / name[:2] / (name + SUFFIX)

    def _scan(self) -> None:
        """Index what the folder holds, oldest first; delete what dead writers left."""
        found: list[tuple[float, str, int]] = []
        euid, unsafe = os.geteuid(), 0
        for sub in self.root.iterdir() if self.root.is_dir() else ():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f.name.startswith(TMP_PREFIX):
                    if not _writer_alive(f.name):
                        with contextlib.suppress(OSError):
                            f.unlink()
                elif f.name.endswith(SUFFIX):
                    with contextlib.suppress(OSError):
                        st = f.lstat()
                        # a page another user could have rewritten in place (or a link to
                        # anything): not trusted, removed
                        if (not stat.S_ISREG(st.st_mode) or st.st_uid not in (euid, 0)
                                or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
                            unsafe += 1
                            f.unlink()
                            continue
                        found.append((st.st_mtime, f.name[: -len(SUFFIX)], st.st_size))
        if unsafe:
            log.warning("radix-global: disk tier %s: removed %d page files that other users "
                        "could write", self.root, unsafe)
        for _, name, size in sorted(found):
            self._lru[name] = (size, None)
            self._used += size

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def used_bytes(self) -> int:
        return self._used

    def exists(self, key: str) -> bool:
        """On disk: known here, or written by another process sharing the folder since."""
        name = file_stem(key)
        with self._lock:
            if name in self._lru:
                return True
        try:
            size = self._path(name).stat().st_size
        except OSError:
            return False
        with self._lock:
            if name not in self._lru:
                self._lru[name] = (size, None)
                self._used += size
        return True

    def write(self, key: str, chunks: Sequence[object], tag: int, parent: int | None,
              page_size: int) -> WriteResult:
        """Store the page, and name the pages evicted to make room for it. A page that is on
        disk is only touched (same key: same bytes); a write that fails leaves none."""
        name = file_stem(key)
        path = self._path(name)
        with self._lock:
            known = name in self._lru
            if known:
                self._lru.move_to_end(name)
        if known:
            try:
                os.utime(path)
                return WriteResult(True, False, [])
            except OSError:  # another process removed it: write it again
                self._forget(name)
        views = buffers(chunks)
        payload_len = sum(v.nbytes for v in views)
        h = xxhash.xxh3_64()
        for v in views:
            h.update(v)
        head = pack_head(key, payload_len, h.intdigest(), tag, parent, page_size)
        tmp = path.parent / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if not path.parent.is_dir():
                path.parent.mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)
                _sync_dir(path.parent.parent)  # the new subfolder's own entry
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE),
                           "wb") as f:
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
            return WriteResult(False, False, [])
        try:  # the rename is durable only once the folder entry is
            _sync_dir(path.parent)
        except OSError as exc:  # the page is there and readable; only a power loss could lose it
            log.warning("radix-global: disk tier folder sync failed: %r", exc)
        size = len(head) + payload_len
        with self._lock:
            old = self._lru.get(name)
            self._used += size - (old[0] if old else 0)  # another thread may have written it
            self._lru[name] = (size, tag)
            self._lru.move_to_end(name)
            gone = self._over_capacity()
        return WriteResult(True, True, self._unlink(gone))

    def _over_capacity(self) -> list[tuple[str, int | None]]:
        """Under the lock: the oldest entries to drop until the folder fits."""
        gone = []
        while self._used > self.capacity_bytes and len(self._lru) > 1:
            name, (size, tag) = self._lru.popitem(last=False)
            self._used -= size
            gone.append((name, tag))
        return gone

    def _unlink(self, gone: list[tuple[str, int | None]]) -> list[int]:
        """Outside the lock: delete the files; their tags (read from a header when unknown)."""
        tags = []
        for name, tag in gone:
            if tag is None:
                page = read_head(self._path(name))
                tag = page.tag if page is not None else None
            with contextlib.suppress(OSError):
                self._path(name).unlink()
            if tag is not None:
                tags.append(tag)
        return tags

    def read_into(self, key: str, chunks: Sequence[object]) -> bool:
        """Fill ``chunks`` with the page; False (and the file removed) for a missing, short,
        foreign or damaged one."""
        name = file_stem(key)
        path = self._path(name)
        views = buffers(chunks)
        want = sum(v.nbytes for v in views)
        try:
            with open(path, "rb") as f:
                # a file too big for a page of this size is damaged, whatever its header says
                too_big = os.fstat(f.fileno()).st_size > max_file_bytes(want)
                data = b"" if too_big else f.read()
        except OSError:
            self._forget(name)
            return False
        page = parse_head(data)
        if page is None or page.key != key or page.nbytes != want:
            self._damaged(name, path)
            return False
        body = memoryview(data)[len(data) - want:]
        if xxhash.xxh3_64_intdigest(body) != payload_sum(data):
            self._damaged(name, path)
            return False
        off = 0
        for v in views:
            v[:] = body[off : off + v.nbytes]
            off += v.nbytes
        with self._lock:
            if name in self._lru:
                self._lru[name] = (self._lru[name][0], page.tag)
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
            entry = self._lru.pop(name, None)
            if entry is not None:
                self._used -= entry[0]

    def remove(self, key: str) -> bool:
        name = file_stem(key)
        with self._lock:
            known = name in self._lru
        self._forget(name)
        with contextlib.suppress(OSError):
            self._path(name).unlink()
        return known

    def pages(self) -> list[DiskPage]:
        """The header of every page on disk, for announcing the tier; a file whose header is
        damaged is removed."""
        with self._lock:
            names = list(self._lru)
        out = []
        for name in names:
            page = read_head(self._path(name))
            if page is not None:
                out.append(page)
            elif self._path(name).exists():
                self._damaged(name, self._path(name))
            else:
                self._forget(name)
        return out

    def clear(self) -> list[int]:
        """Remove every page; their tags."""
        with self._lock:
            gone = list((n, t) for n, (_, t) in self._lru.items())
            self._lru.clear()
            self._used = 0
        return self._unlink(gone)
