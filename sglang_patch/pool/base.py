"""The L3 page pool contract: a key -> bytes store that several worker processes share.

Every pool (the shared-memory pool of one machine, a Mooncake Store later) implements
:class:`PagePool`, so the SGLang storage backend (``sglang_patch/storage.py``) never depends on one.

Contract (every implementation):

- Keys are strings and already carry the model namespace (``"<namespace>/<hex digest>"``); the pool
  never interprets them. Two different keys never alias.
- A page is written from, and read into, a *sequence of buffers* (scatter/gather), so a caller whose
  page is not contiguous in its own memory (SGLang's layer-first host pool) needs no staging copy.
  The page's bytes are the concatenation of the buffers, in order.
- ``put`` is idempotent: storing a key that exists only refreshes its recency. A page larger than
  ``page_bytes`` is refused (``stored=False``), never truncated.
- ``get_into`` returns True only if the destination now holds exactly the bytes that were ``put``:
  a missing key, a page evicted or replaced while it was being read, a length mismatch, or a
  checksum failure are all misses (False). A miss is always safe: the engine recomputes.
- The pool is bounded (``capacity_pages``); when full, ``put`` evicts least-recently-used pages and
  reports them in :class:`PutResult` so the caller can tell the index.
- Every page carries an opaque int64 ``tag`` given at ``put`` and returned on eviction (the storage
  backend uses the page's :data:`~radix_global.types.PageKey`).
- The pool survives its own processes: a writer killed mid-``put`` never keeps its slot for good
  (its slot is reclaimed once the writer is known dead or its write lease expires), and a pool whose
  shared state is found damaged (:class:`PoolCorrupt`, never another exception, a hang or a fatal
  signal) resets itself: every page is dropped, the operation that found it is a miss (a refused
  ``put``, whose ``evicted`` lists the pages the reset dropped that the pool could still name),
  and the next operations work on the emptied pool, in every process sharing it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

from radix_global.types import PoolId

# Anything exposing the buffer protocol with contiguous bytes: numpy arrays, memoryviews, bytes.
ReadableBuffer = object
WritableBuffer = object


class PoolError(Exception):
    """A pool that cannot be opened or used (bad config, config mismatch with an existing pool)."""


class CorruptReason(StrEnum):
    """What was found damaged in a pool's shared state."""

    BAD_HEADER = "bad_header"  # magic, version, geometry or its checksum wrong
    SHORT_FILE = "short_file"  # a file is shorter than its mapping (truncated while mapped)
    BAD_TABLE = "bad_table"  # a key-index entry out of range, or no free position left
    BAD_SLOT = "bad_slot"  # a slot record with an impossible state or length


class PoolCorrupt(PoolError):
    """The pool's shared state is damaged. Raised inside a pool implementation only: its public
    operations catch it, reset the pool (see module contract) and report a miss."""

    def __init__(self, reason: CorruptReason, detail: str) -> None:
        super().__init__(f"pool corrupt ({reason.value}): {detail}")
        self.reason = reason


class EvictedPage(NamedTuple):
    """A page the pool dropped to make room: its key's digest (hex; pools need not keep the key
    string) and the tag it was stored with (what callers use to name it)."""

    key_digest: str
    tag: int


class PutResult(NamedTuple):
    """Outcome of :meth:`PagePool.put`."""

    stored: bool  # the key is in the pool now (newly written or already there)
    new: bool  # this call wrote it (False: it was already there, or refused)
    evicted: tuple[EvictedPage, ...]  # pages dropped to make room for it


def as_bytes(buf: object) -> memoryview:
    """A page chunk as a flat byte view (no copy); memoryview slice assignment is a plain C
    memcpy. Every pool reads its callers' chunks through it."""
    view = memoryview(buf)  # type: ignore[arg-type]
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class PageIO(NamedTuple):
    """One page of a batch call: its key, its buffers (the page is their concatenation) and the
    tag it is stored with (ignored by reads)."""

    key: str
    chunks: Sequence[object]
    tag: int = 0


class PoolStats(NamedTuple):
    """Counters shared by every process using the pool (since the pool was created)."""

    pool_id: str
    pages: int
    capacity_pages: int
    page_bytes: int
    stores: int
    hits: int
    misses: int
    evictions: int
    checksum_failures: int
    evicted_mid_read: int
    resets: int = 0  # times the pool found itself corrupt and emptied itself
    reclaimed_writes: int = 0  # slots taken back from writers that died (or outlived their lease)


class PagePool(ABC):
    """A bounded, checksummed, LRU page store shared by the worker processes that open it."""

    pool_id: PoolId
    page_bytes: int  # the largest page the pool accepts
    capacity_pages: int

    @abstractmethod
    def put(self, key: str, chunks: Sequence[ReadableBuffer], tag: int = 0) -> PutResult:
        """Store the concatenation of ``chunks`` under ``key`` (see module contract)."""

    @abstractmethod
    def get_into(self, key: str, chunks: Sequence[WritableBuffer]) -> bool:
        """Fill ``chunks`` (whose total size must equal the stored page) with the page's bytes."""

    def put_many(self, pages: Sequence[PageIO]) -> list[PutResult]:
        """``put`` of each page, in order (one result each). A pool whose transfers are cheaper
        in batches (one network round trip for many pages) overrides it; the default puts one
        page at a time."""
        return [self.put(p.key, p.chunks, p.tag) for p in pages]

    def get_many(self, pages: Sequence[PageIO]) -> list[bool]:
        """``get_into`` of each page, in order (one result each; see ``put_many``). A False
        page's buffers may hold any bytes afterwards: the caller must not use them."""
        return [self.get_into(p.key, p.chunks) for p in pages]

    def register_memory(self, buffer: WritableBuffer) -> None:  # noqa: B027 (optional hook)
        """The caller's pages will mostly live in ``buffer`` (SGLang's host pool), for the
        lifetime of the pool. A pool that moves bytes between registered memory only (Mooncake)
        registers it, so transfers to and from it need no staging copy; others ignore it."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` is stored now (a later ``get_into`` may still miss: eviction)."""

    @abstractmethod
    def remove(self, key: str) -> bool:
        """Drop ``key``; False if it was not there."""

    @abstractmethod
    def clear(self) -> list[int]:
        """Drop every page (of every namespace sharing the pool); the dropped pages' tags."""

    @abstractmethod
    def stats(self) -> PoolStats: ...

    @abstractmethod
    def close(self) -> None:
        """Release this process's handles; the pool's pages stay for the other processes."""
