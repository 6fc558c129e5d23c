"""Simulated cache holders and prefill instances.

:class:`PageCache`: an LRU set of pages of one holder (an instance's local cache or the global
pool) that reports every change as index operations (``StorePages`` / ``RemovePages``), the way
an engine's KV events would. Ancestors are always refreshed after their descendants, so LRU order
evicts leaves before their parents, as a radix cache does.

:class:`PrefillInstance`: one prefill node, serving one request at a time in FIFO order.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

from radix_global.ops import IndexOp, RemovePages, StorePages
from radix_global.types import HolderId, Location, Namespace, PageKey, Tier, WorkerId


class PageCache:
    """LRU cache of ``capacity_pages`` pages held at ``location`` in ``namespace``."""

    def __init__(self, namespace: Namespace, location: Location, capacity_pages: int) -> None:
        if capacity_pages < 1:
            raise ValueError("a cache holds at least one page")
        self.namespace = namespace
        self.location = location
        self.capacity_pages = capacity_pages
        self._pages: OrderedDict[PageKey, None] = OrderedDict()
        self.evicted_pages = 0

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, key: object) -> bool:
        return key in self._pages

    @property
    def holder(self) -> HolderId:
        return self.location.holder

    def prefix_pages(self, keys: Sequence[PageKey]) -> int:
        """Length of the leading run of ``keys`` held here."""
        n = 0
        for k in keys:
            if k not in self._pages:
                break
            n += 1
        return n

    def touch(self, keys: Sequence[PageKey]) -> None:
        """Mark held ``keys`` (a prefix chain) used now, deepest first so ancestors end newest."""
        for k in reversed(keys):
            if k in self._pages:
                self._pages.move_to_end(k)

    def insert(self, keys: Sequence[PageKey]) -> list[IndexOp]:
        """Hold the chain ``keys`` (a prompt's pages in order); return the index operations:
        one store of the missing tail and one removal of everything evicted to make room.
        A chain longer than the capacity keeps only its leading ``capacity_pages`` pages."""
        keys = keys[: self.capacity_pages]
        held = self.prefix_pages(keys)
        new = [k for k in keys[held:] if k not in self._pages]
        ops: list[IndexOp] = []
        if new:
            parent = keys[held - 1] if held else None
            ops.append(StorePages(self.namespace, self.location, parent, list(new)))
        for k in reversed(keys):
            self._pages[k] = None
            self._pages.move_to_end(k)
        evicted: list[PageKey] = []
        while len(self._pages) > self.capacity_pages:
            k, _ = self._pages.popitem(last=False)
            evicted.append(k)
        if evicted:
            self.evicted_pages += len(evicted)
            ops.append(RemovePages(self.namespace, self.location, evicted))
        return ops


class PrefillInstance:
    """One prefill node: a FIFO of requests served one at a time, and its local page cache."""

    def __init__(self, worker_id: WorkerId, cache: PageCache) -> None:
        self.worker_id = worker_id
        self.cache = cache
        self.busy_until = 0.0
        self._starts: deque[tuple[float, int]] = deque()  # (start time, input tokens) queued
        self.busy_s = 0.0
        self.served = 0

    def enqueue(self, now: float, service_s: float, input_tokens: int) -> tuple[float, float]:
        """Queue a request arriving at ``now`` needing ``service_s``; return (start, finish)."""
        start = max(now, self.busy_until)
        finish = start + service_s
        self.busy_until = finish
        self.busy_s += service_s
        self.served += 1
        self._starts.append((start, input_tokens))
        return start, finish

    def _expire(self, now: float) -> None:
        while self._starts and self._starts[0][0] <= now:
            self._starts.popleft()

    def waiting(self, now: float) -> int:
        """Requests queued and not yet started at ``now``."""
        self._expire(now)
        return len(self._starts)

    def waiting_tokens(self, now: float) -> int:
        self._expire(now)
        return sum(t for _, t in self._starts)

    def running(self, now: float) -> int:
        # FIFO without gaps: while work remains, exactly one request is being prefilled.
        return 1 if self.busy_until > now else 0


def local_location(worker_id: WorkerId) -> Location:
    """Where an instance's own cache lives in the index: its host DRAM (L2)."""
    return Location(worker_id, 0, Tier.HOST)
