"""Which of its written pages a pool client probes next, for a store that evicts without telling
(Mooncake: ``sglang_patch/pool/mooncake_pool.py``). Pure bookkeeping, no I/O.

Order of a resync round (at most ``limit`` keys):
1. pages read since their last probe, the most read first. These are the pages requests are being
   routed for now, where a stale index entry costs a planned fetch that loads nothing. Probing
   them adds almost no eviction delay: the read itself took Mooncake's 10 s lease, and a probe
   only extends it.
2. then the rest, the least recently probed (or written) first: round-robin, at most
   ``share = max(1, rest // spread)`` of them a round, and at least ``min(share, limit // 2)``
   however many pages are in demand. So with ``limit >= 2`` every page is probed within
   ``max(2 * spread, ceil(2 * remembered / limit))`` rounds and, with at least ``spread`` pages
   remembered and none in demand, not more often than every ``spread`` rounds. A probe takes
   Mooncake's read lease (10 s), which pins the page against eviction: probing every page
   every round would pin every page for good.

At most ``capacity`` pages are remembered (a segment's worth). A page pushed out by newer writes
was most likely evicted by the store already; it is reported as gone without a probe (an index
that forgets a page only predicts less) by :meth:`ProbeQueue.take_forgotten`.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Mapping


class ProbeQueue:
    """The pages (key -> tag) one client wrote, in probing order (see module docstring)."""

    def __init__(self, capacity: int, spread: int = 1) -> None:
        if capacity <= 0 or spread <= 0:
            raise ValueError(f"capacity and spread must be > 0, got {capacity}, {spread}")
        self.capacity = capacity
        self.spread = spread
        self._order: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._reads: dict[str, int] = {}  # key -> reads since its last probe
        self._forgotten: list[int] = []  # tags pushed out, not yet reported

    def __len__(self) -> int:
        return len(self._order)

    def written(self, key: str, tag: int) -> None:
        """``key`` was stored (or stored again): it goes to the back of the round-robin."""
        self._order[key] = tag
        self._order.move_to_end(key)
        while len(self._order) > self.capacity:
            old, old_tag = self._order.popitem(last=False)
            self._reads.pop(old, None)
            self._forgotten.append(old_tag)
        # bounded: with no resync running nobody takes them
        del self._forgotten[:-self.capacity]

    def read(self, key: str) -> None:
        """A read of ``key`` hit: it is probed ahead of the round-robin."""
        if key in self._order:
            self._reads[key] = self._reads.get(key, 0) + 1

    def forget(self, key: str) -> int | None:
        """``key`` left the store by our own hand (removed): its tag, or None if unknown."""
        self._reads.pop(key, None)
        return self._order.pop(key, None)

    def next(self, limit: int) -> list[str]:
        """The keys to probe this round (no side effect until :meth:`probed`)."""
        limit = max(0, limit)
        demand = len(self._reads)
        share = max(1, (len(self._order) - demand) // self.spread)  # the round-robin's
        # pages in demand first, but never all of a round of two or more: the rest would starve
        hot = heapq.nlargest(limit - min(share, limit // 2), self._reads,
                             key=self._reads.__getitem__)
        chosen = set(hot)
        rest = (k for k in self._order if k not in chosen)
        return hot + list(itertools.islice(rest, min(share, limit - len(hot))))

    def probed(self, found: Mapping[str, bool]) -> list[int]:
        """What a probe found (key -> still stored); the tags of the pages gone, which are
        forgotten. The others go to the back of the round-robin, their read count reset."""
        gone: list[int] = []
        for key, exists in found.items():
            self._reads.pop(key, None)
            if key not in self._order:
                continue
            if exists:
                self._order.move_to_end(key)
            else:
                gone.append(self._order.pop(key))
        return gone

    def take_forgotten(self) -> list[int]:
        """The tags pushed out of the remembered set since the last call."""
        out, self._forgotten = self._forgotten, []
        return out

    def clear(self) -> list[int]:
        """Forget everything; every tag remembered or pushed out but not yet reported."""
        tags = [*self._order.values(), *self._forgotten]
        self._order.clear()
        self._reads.clear()
        self._forgotten = []
        return tags
