"""When each Mooncake segment's link is next free, as this router planned its fetches.

A segment sends from one host's link: a fetch planned from it waits behind the fetches planned
before it (``docs/interfaces.md``, "Where hosts are": a sender's backlog). Each planned fetch
holds the link until its predicted end (the wait it was priced with, then its own transfer), so
nothing needs releasing: the backlog drains with time. Pure: no I/O, time passed in.
"""

from __future__ import annotations

from radix_global.types import PoolId

PRUNE_AT = 4096  # segments remembered before the idle ones are dropped


class SenderBacklog:
    def __init__(self) -> None:
        self._free_at: dict[PoolId, float] = {}  # segment -> when its planned sends end

    def book(self, segment: PoolId, now: float, until: float) -> None:
        """A fetch from ``segment`` planned ``now`` is to end at ``until``."""
        if until > self._free_at.get(segment, 0.0):
            self._free_at[segment] = until
        if len(self._free_at) > PRUNE_AT:  # many segments: forget the idle ones at once
            self._free_at = {s: t for s, t in self._free_at.items() if t > now}

    def wait_s(self, segment: PoolId, now: float) -> float:
        """How long a fetch from ``segment`` planned ``now`` waits for the link."""
        return max(0.0, self._free_at.get(segment, 0.0) - now)

    def __len__(self) -> int:
        return len(self._free_at)
