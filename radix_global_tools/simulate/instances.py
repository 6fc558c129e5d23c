"""Simulated cache holders and prefill instances.

:class:`PageCache`: an LRU set of pages of one holder (an instance's local cache or the global
pool) that reports every change as index operations (``StorePages`` / ``RemovePages``), the way
an engine's KV events would. Ancestors are always refreshed after their descendants, so LRU order
evicts leaves before their parents, as a radix cache does.

:class:`PrefillInstance`: one prefill node, serving its FIFO queue in batches of up to
``max_batch`` requests (one at a time by default).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Generic, NamedTuple, TypeVar

from radix_global.ops import IndexOp, RemovePages, StorePages
from radix_global.types import HolderId, Location, Namespace, PageKey, Tier, WorkerId

T = TypeVar("T")


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

    def insert(self, keys: Sequence[PageKey], start: int = 0) -> list[IndexOp]:
        """Hold the chain ``keys`` (a prompt's pages in order) from page ``start`` on (the
        first ``start`` are held elsewhere: a shared store keeps one copy of a page); return the
        index operations: one store of the missing tail and one removal of everything evicted
        to make room. A chain longer than the capacity keeps only its first ``capacity_pages``
        pages from ``start``."""
        keys = keys[: start + self.capacity_pages]
        tail = keys[start:]
        held = start + self.prefix_pages(tail)
        new = [k for k in keys[held:] if k not in self._pages]
        ops: list[IndexOp] = []
        if new:
            parent = keys[held - 1] if held else None
            ops.append(StorePages(self.namespace, self.location, parent, list(new)))
        for k in reversed(tail):
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


class Waiting(NamedTuple, Generic[T]):
    """A request queued at an instance: what it needs alone, and what the caller keeps with it."""

    service_s: float  # fetch + prefill time if it ran alone
    input_tokens: int
    payload: T
    kv_tokens: int = 0  # KV it holds on this instance from its prefill on (co-located decode)


class Batch(NamedTuple, Generic[T]):
    """A prefill batch that started: every member's first token comes when the batch ends."""

    start_s: float
    finish_s: float
    members: list[Waiting[T]]


class PrefillInstance(Generic[T]):
    """One prefill node and its local page cache. Requests wait FIFO; when the node frees, up to
    ``max_batch`` of those waiting start together as one batch, as an SGLang engine puts its
    waiting prompts into one prefill (``max_batch`` 1: one at a time). A batch pays the
    per-forward ``batch_overhead_s`` once: its time is the members' service times summed, less
    that overhead for every member past the first.

    The caller drives time: :meth:`enqueue` says when a batch start is due (schedule it), and
    :meth:`start` at that time closes the batch and says when the next start is due."""

    def __init__(self, worker_id: WorkerId, cache: PageCache, max_batch: int = 1,
                 batch_overhead_s: float = 0.0) -> None:
        if max_batch < 1:
            raise ValueError("a prefill batch holds at least one request")
        self.worker_id = worker_id
        self.cache = cache
        self.max_batch = max_batch
        self.batch_overhead_s = batch_overhead_s
        self.busy_until = 0.0
        self._waiting: deque[Waiting[T]] = deque()
        self._start_due = False  # a start is scheduled for the head of the queue
        self._running = 0  # members of the batch that ends at busy_until
        self.busy_s = 0.0
        self.served = 0

    def enqueue(self, now: float, request: Waiting[T]) -> float | None:
        """Queue ``request`` at ``now``; return when a batch start is due if the caller must
        schedule one (none is scheduled yet), else None."""
        self._waiting.append(request)
        if self._start_due:
            return None
        self._start_due = True
        return max(now, self.busy_until)

    def start(self, now: float, kv_free: float = math.inf) -> tuple[Batch[T], float | None]:
        """Start the batch due at ``now``: the batch, and when the next start is due (None: no
        one waits). The batch takes waiting requests in order while their KV fits ``kv_free``
        (the first one always: the caller only starts a batch when it fits or nothing could
        free room)."""
        members = [self._waiting.popleft()]
        kv = members[0].kv_tokens
        while self._waiting and len(members) < self.max_batch \
                and kv + self._waiting[0].kv_tokens <= kv_free:
            kv += self._waiting[0].kv_tokens
            members.append(self._waiting.popleft())
        n = len(members)
        run_s = sum(m.service_s for m in members) - self.batch_overhead_s * (n - 1)
        finish = now + max(run_s, 0.0)
        self.busy_until, self._running = finish, n
        self.busy_s += finish - now
        self.served += n
        self._start_due = bool(self._waiting)
        return Batch(now, finish, members), (finish if self._waiting else None)

    def head_kv_tokens(self) -> int:
        """The KV the next request to start needs (0 when none waits)."""
        return self._waiting[0].kv_tokens if self._waiting else 0

    def free_at(self, now: float) -> float:
        """When a request queued at ``now`` would start, if every request ahead ran alone."""
        return max(now, self.busy_until) + sum(w.service_s for w in self._waiting)

    def waiting(self) -> int:
        """Requests queued and not yet started."""
        return len(self._waiting)

    def waiting_tokens(self) -> int:
        return sum(w.input_tokens for w in self._waiting)

    def running(self, now: float) -> int:
        return self._running if self.busy_until > now else 0


def local_location(worker_id: WorkerId) -> Location:
    """Where an instance's own cache lives in the index: its host DRAM (L2)."""
    return Location(worker_id, 0, Tier.HOST)
