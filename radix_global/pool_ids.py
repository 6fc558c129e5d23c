"""Pool ids of stores that span hosts (``docs/interfaces.md``, "Mooncake Store as the L3 pool").
Pure.

A pool id ``<store>@<segment>`` names one segment of a store that several hosts share (a
Mooncake Store: each worker's client contributes a segment of its host's memory and writes its
pages there). Workers read every segment of their store, and a segment dies with the client that
contributed it, so the index keeps one holder per segment: losing a host drops exactly its
pages. A pool id without ``@`` is a pool of its own (the shm pool of one machine).
"""

from __future__ import annotations

from radix_global.types import PoolId

SEGMENT_SEP = "@"


def segment_pool_id(store: str, segment: str) -> PoolId:
    """The pool id of ``segment`` (a host or client name) of the shared store ``store``."""
    if SEGMENT_SEP in store or not store or not segment:
        raise ValueError(f"store {store!r} / segment {segment!r}: non-empty, store without "
                         f"{SEGMENT_SEP!r}")
    return PoolId(f"{store}{SEGMENT_SEP}{segment}")


def store_of(pool_id: str) -> str:
    """The store a pool id belongs to: itself, or the part before ``@`` for a segment."""
    return pool_id.split(SEGMENT_SEP, 1)[0]


def is_segment(pool_id: str) -> bool:
    """Whether ``pool_id`` names one segment of a shared store (it dies with its writer)."""
    return SEGMENT_SEP in pool_id


def segment_host(pool_id: str) -> str | None:
    """The host of a segment's pool id (``<store>@<address>:<port>`` -> address), None for a pool
    id that is not a segment."""
    if not is_segment(pool_id):
        return None
    segment = pool_id.split(SEGMENT_SEP, 1)[1]
    return segment.rsplit(":", 1)[0] if ":" in segment else segment


DISK_SUFFIX = "+disk"


def disk_holder(pool_id: str) -> PoolId:
    """The index holder of a pool's persistent disk tier (``docs/interfaces.md``,
    "The persistent disk tier under the pool")."""
    return PoolId(pool_id + DISK_SUFFIX)


def is_disk_holder(holder: str) -> bool:
    """Whether ``holder`` is a pool's disk tier (:func:`disk_holder`)."""
    return holder.endswith(DISK_SUFFIX)


def is_store_segment(holder: str) -> bool:
    """Whether ``holder`` is a segment of a shared store, which every worker of that store reads
    (a segment's disk tier, ``<segment>+disk``, looks like one and is read by its owner only)."""
    return is_segment(holder) and not is_disk_holder(holder)


def leaving_with_worker(pool_id: str | None, disk_id: str | None) -> list[PoolId]:
    """The pool holders that leave the index with their worker: a Mooncake segment (it dies with
    the client that contributed it) and its disk tier (a folder of that worker's host, read only
    through it; the worker announces it again when it is back). None for a pool of its own (one
    machine's shm pool, its disk), which lives on."""
    if pool_id is None or not is_segment(pool_id):
        return []
    return [PoolId(pool_id)] + ([PoolId(disk_id)] if disk_id else [])
