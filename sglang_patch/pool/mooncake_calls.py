"""How :class:`~sglang_patch.pool.mooncake_pool.MooncakePagePool` cuts a batch of pages into
Mooncake calls. Pure: no store, no I/O.

A page moves one of two ways (the pool's docstring says why):
- zero-copy: each chunk is a transfer of its own, plus one for the page's checksum slot. Only
  for pages whose chunks all lie in registered memory, average ``zero_copy_min_chunk`` bytes and
  fit one call (``BATCH_BUFFERS`` transfers);
- packed: the page is copied into a staging slot and moves as one transfer.

A call holds pages of one way only (a batch that alternates costs a call per change; the
storage backend's pages all have one shape), at most ``BATCH_BUFFERS`` transfers (so at most
``BATCH_BUFFERS // 2`` zero-copy pages: the checksum slots) and at most the staging slots'
worth of packed pages. Pages stay in their order; a page is never split over calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from sglang_patch.pool.base import PageIO, as_bytes

# The most buffers (transfers) one call carries. Mooncake's TCP transport queues at most 1024
# transfers per peer (MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER) and rejects the rest, and a call
# with rejected transfers was seen to hang (2304 buffers in one call): a quarter of that queue
# leaves room for the other calls to the same peer.
BATCH_BUFFERS = 256
# Over TCP each buffer of a call is a transfer of its own: measured here (docs/benchmarks.md,
# "Transfer modes"), pages of 8 KiB and 32 KiB chunks read faster packed (one transfer per
# page, after a copy), pages of 64 KiB and 1 MiB chunks zero-copy.
ZERO_COPY_MIN_CHUNK = 64 << 10

Region = tuple[int, int]  # registered memory: [start, end) addresses


class CallPage(NamedTuple):
    """A page of a call: its index in the caller's list, key and tag, its views, their
    (address, size), its size, and whether it moves zero-copy (else packed)."""

    at: int
    key: str
    tag: int
    views: list[memoryview]
    spans: list[tuple[int, int]]
    size: int
    direct: bool


def address_of(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0


def zero_copy(spans: Sequence[tuple[int, int]], regions: Sequence[Region],
              min_chunk: int) -> bool:
    """Whether a page of these (address, size) chunks moves zero-copy."""
    return 0 < len(spans) < BATCH_BUFFERS and sum(n for _, n in spans) >= min_chunk * len(
        spans) and all(any(lo <= a and a + n <= hi for lo, hi in regions) for a, n in spans)


def plan_calls(pages: Sequence[PageIO], regions: Sequence[Region], page_bytes: int,
               zero_copy_min_chunk: int, packed_slots: int) -> list[list[CallPage]]:
    """``pages`` as consecutive calls (see module docstring); a page larger than
    ``page_bytes`` is in none (the caller counts it a miss)."""
    out: list[list[CallPage]] = []
    transfers = 0
    for i, page in enumerate(pages):
        views = [as_bytes(c) for c in page.chunks]
        spans = [(address_of(v), v.nbytes) for v in views]
        size = sum(n for _, n in spans)
        if size > page_bytes:
            continue
        d = CallPage(i, page.key, page.tag, views, spans, size,
                     zero_copy(spans, regions, zero_copy_min_chunk))
        n = len(spans) + 1 if d.direct else 1
        if (not out or out[-1][0].direct != d.direct or transfers + n > BATCH_BUFFERS
                or (not d.direct and len(out[-1]) == packed_slots)):
            out.append([])
            transfers = 0
        out[-1].append(d)
        transfers += n
    return out
