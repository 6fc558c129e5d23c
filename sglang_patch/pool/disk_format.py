"""The page file of the disk tier (``docs/interfaces.md``,
"The persistent disk tier under the pool"): a checksummed header (magic, version, payload length and
xxh3-64, the page's tag and its parent's, tokens per page, the pool key, the header's own xxh3-64),
then the payload. Pure parsing, and the folder's read bandwidth.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import xxhash

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


def pack_head(key: str, payload_len: int, payload_sum: int, tag: int, parent: int | None,
              page_size: int) -> bytes:
    """A page file's header."""
    kb = key.encode()
    head = _HEAD.pack(MAGIC, VERSION, payload_len, payload_sum, tag,
                      0 if parent is None else parent, parent is not None, page_size, len(kb)) + kb
    return head + _HEAD_SUM.pack(xxhash.xxh3_64_intdigest(head))


def payload_sum(data: bytes) -> int:
    """The payload checksum a (parsed, valid) file's header records."""
    return int(_HEAD.unpack_from(data)[3])


def max_file_bytes(payload_len: int) -> int:
    """The largest file a page of ``payload_len`` bytes can be (its key at most 64 KiB)."""
    return payload_len + _HEAD.size + _HEAD_SUM.size + 65536


def file_stem(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def buffers(chunks: Sequence[object]) -> list[memoryview]:
    return [memoryview(c).cast("B") for c in chunks]  # type: ignore[arg-type]


def read_head(path: Path) -> DiskPage | None:
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD.size + 65536 + _HEAD_SUM.size)
    except OSError:
        return None
    return parse_head(head, whole=False)


def parse_head(data: bytes, whole: bool = True) -> DiskPage | None:
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
