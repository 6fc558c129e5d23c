"""Index snapshots on disk: write atomically, read back with a clear error for a bad file.

File layout (all integers big-endian)::

    magic   8 bytes  b"RGIXSNAP"
    version u16      FORMAT_VERSION; a file of another version is refused, never guessed at
    length  u64      body length in bytes (a shorter file is "truncated")
    digest  u64      xxh64 of the body (a mismatch is "corrupt")
    body             msgpack of :class:`IndexSnapshot`

A write goes to a temporary file in the same folder, is fsynced and renamed over the target, so a
crash mid-write leaves the previous snapshot intact. Restoring: :func:`load_on_start` (a missing
file is a fresh start; a bad file stops the start unless the user asked to start empty).

Every failure to read a file, whatever is wrong with it (a valid checksum over deep nesting, or
a clock ``created_at`` that is not a finite number >= 0, included), is a :class:`SnapshotError`.
A worker record that is no longer a valid registration (an older build accepted it) is left out
with a warning, as ``ServiceState.restore_workers`` leaves out one it cannot re-register: the
index state still comes back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import struct
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import xxhash

from radix_global.events import RekeyedPage
from radix_global.registration import WorkerInfo

log = logging.getLogger(__name__)

MAGIC = b"RGIXSNAP"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sHQQ")


class SnapshotError(Exception):
    """A snapshot file that cannot be read: names the file and what is wrong with it."""


class FeedPosition(msgspec.Struct, frozen=True, array_like=True):
    """Where one KV-event feed stood: the last seq applied (-1: none) and the xxh64 of that
    batch's payload, which tells the same engine's batch from a restarted engine's batch of the
    same seq (``docs/interfaces.md``, "The router's index snapshot")."""

    seq: int
    digest: int


class FeedState(msgspec.Struct, frozen=True):
    """What a worker's KV-event feeds need to continue after a restore: each dp rank's
    position, and the decoder's re-keying map (salted, LoRA and vLLM pages are known by our
    keys, their removals and children by the engine's hashes)."""

    positions: list[FeedPosition]
    rekeyed: list[RekeyedPage] = []


class IndexSnapshot(msgspec.Struct, frozen=True):
    """Everything an index needs to come back: the index state and who was registered.

    ``index`` is the plain data of ``GlobalIndex.snapshot()`` (or ``ShardedIndex.snapshot()``);
    ``created_at`` is the clock of the hotness decay: wall-clock seconds for the service, the
    router's monotonic clock for its embedded index. ``feeds``: worker id -> its feeds' state
    (absent in older files: no worker resumes its stream).
    """

    created_at: float
    index: Any
    workers: list[WorkerInfo] = []
    feeds: dict[str, FeedState] = {}


class _Body(msgspec.Struct):
    """:class:`IndexSnapshot` as read: worker records kept raw, to be checked one by one."""

    created_at: float
    index: Any
    workers: list[msgspec.Raw] = []
    feeds: dict[str, FeedState] = {}


class SnapshotWritten(msgspec.Struct, frozen=True):
    path: str
    size_bytes: int
    seconds: float


def encode_snapshot(snapshot: IndexSnapshot) -> bytes:
    body = msgspec.msgpack.encode(snapshot)
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(body), xxhash.xxh64_intdigest(body)) + body


def decode_snapshot(data: bytes, source: str = "<bytes>") -> IndexSnapshot:
    """Inverse of :func:`encode_snapshot`; every failure is a :class:`SnapshotError`."""
    if len(data) < _HEADER.size:
        raise SnapshotError(f"{source}: truncated header ({len(data)} of {_HEADER.size} bytes)")
    magic, version, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SnapshotError(f"{source}: not an index snapshot (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise SnapshotError(
            f"{source}: snapshot format version {version}, this build reads {FORMAT_VERSION}"
        )
    body = data[_HEADER.size :]
    if len(body) != length:
        raise SnapshotError(f"{source}: truncated body ({len(body)} of {length} bytes)")
    if xxhash.xxh64_intdigest(body) != digest:
        raise SnapshotError(f"{source}: corrupt body (checksum mismatch)")
    try:
        raw = msgspec.msgpack.decode(body, type=_Body)
    except Exception as exc:  # RecursionError (deep nesting) too: a bad file, never a crash
        raise SnapshotError(f"{source}: undecodable body: {type(exc).__name__}: {exc}") from exc
    # Every stamp is restored as ``stamp + now - created_at`` (the router's clock): a clock that
    # is NaN or infinite would make the restored stamps so, and the next snapshot unreadable.
    # Both clocks (wall, monotonic) count from a point in the past: a negative one is no clock.
    if not (math.isfinite(raw.created_at) and raw.created_at >= 0):
        raise SnapshotError(f"{source}: the snapshot clock created_at must be a finite number "
                            f">= 0, got {raw.created_at!r}")
    workers = []
    for record in raw.workers:
        try:
            workers.append(msgspec.msgpack.decode(record, type=WorkerInfo))
        except Exception as exc:
            log.warning("%s: a worker record is left out: %s", source, str(exc)[:300])
    return IndexSnapshot(raw.created_at, raw.index, workers, raw.feeds)


def write_snapshot(path: str | Path, data: bytes) -> SnapshotWritten:
    """Atomically replace ``path`` with the encoded snapshot ``data`` (blocking file I/O)."""
    start = time.perf_counter()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # unique: a periodic write still running in its thread must not share the stop's file
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    # The rename is durable only once the folder entry is on disk.
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return SnapshotWritten(str(target), len(data), time.perf_counter() - start)


def read_snapshot(path: str | Path) -> IndexSnapshot:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read: {exc}") from exc
    return decode_snapshot(data, str(path))


def load_on_start(path: str | Path, start_empty_on_error: bool = False) -> IndexSnapshot | None:
    """The snapshot to restore at start-up, or None to start empty.

    A missing file is a first start (None). A file that cannot be read raises
    :class:`SnapshotError`, unless ``start_empty_on_error`` (the user asked for it): then it is
    logged as a warning and the service starts empty; the bad file is left for inspection until the
    next snapshot replaces it.
    """
    if not Path(path).exists():
        log.info("no snapshot at %s: starting empty", path)
        return None
    try:
        return read_snapshot(path)
    except SnapshotError as exc:
        if not start_empty_on_error:
            raise
        log.warning("ignoring unreadable snapshot (starting empty as asked): %s", exc)
        return None


async def write_now(path: str | Path, take: Callable[[], IndexSnapshot]) -> SnapshotWritten:
    """Take and encode a snapshot on the event loop (the index is only touched there, and the
    state cannot change under the encoder), and write it in a thread."""
    data = encode_snapshot(take())
    return await asyncio.to_thread(write_snapshot, path, data)


async def snapshot_every(
    interval_s: float, path: str | Path, take: Callable[[], IndexSnapshot]
) -> None:
    """Write a snapshot every ``interval_s`` seconds until cancelled; a failed write is logged
    (any error: one bad round must not end the periodic snapshots)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await write_now(path, take)
        except Exception as exc:
            log.error("periodic snapshot to %s failed: %r", path, exc)
