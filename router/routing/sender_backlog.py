"""The bytes this router has planned to fetch from each Mooncake segment and not yet seen loaded.

A segment sends from one host's link: a fetch planned from it waits behind the fetches planned
before it (``docs/interfaces.md``, "Where hosts are": a sender's backlog). Booked when a request
is routed with a fetch from a segment, released at its first token, its end, or its worker's
removal. Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import NamedTuple

from radix_global.types import PoolId, WorkerId


class _Booked(NamedTuple):
    segment: PoolId
    nbytes: float
    worker: WorkerId


class SenderBacklog:
    def __init__(self) -> None:
        self._booked: dict[str, _Booked] = {}  # request id -> its planned fetch
        self._bytes: dict[PoolId, float] = {}  # segment -> bytes booked on it
        self._count: dict[PoolId, int] = {}  # segment -> fetches booked on it

    def book(self, request_id: str, segment: PoolId, nbytes: float, worker: WorkerId) -> None:
        """``request_id`` (routed to ``worker``) will fetch ``nbytes`` from ``segment``; a
        request booked twice keeps its latest fetch."""
        self.release(request_id)
        if nbytes > 0:
            self._booked[request_id] = _Booked(segment, nbytes, worker)
            self._bytes[segment] = self._bytes.get(segment, 0.0) + nbytes
            self._count[segment] = self._count.get(segment, 0) + 1

    def release(self, request_id: str) -> None:
        """The request's fetch is done (or will not happen); unknown ids are ignored."""
        b = self._booked.pop(request_id, None)
        if b is None:
            return
        count = self._count.pop(b.segment) - 1
        if count:
            self._count[b.segment] = count
            self._bytes[b.segment] -= b.nbytes
        else:
            del self._bytes[b.segment]  # no float residue on an idle segment

    def forget_worker(self, worker: WorkerId) -> None:
        """``worker`` left: its requests' fetches will not happen."""
        for rid in [rid for rid, b in self._booked.items() if b.worker == worker]:
            self.release(rid)

    def bytes_on(self, segment: PoolId) -> float:
        """Bytes planned from ``segment`` and not yet loaded."""
        return self._bytes.get(segment, 0.0)

    def __len__(self) -> int:
        return len(self._booked)
