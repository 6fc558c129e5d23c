"""A pool of per-instance segments in fault domains: the Mooncake Store as the product uses it
(``docs/interfaces.md``, "Mooncake Store as the L3 pool", "Where hosts are").

Each instance's client contributes a segment of ``segment_tokens`` and writes the pages it
computes there, past the leading pages the store already holds (one copy of a page, as SGLang's
write-through after the store's exists check); where its segment has no room for them and
another has, they go there (Mooncake's preferred segment is a preference), else the segment
evicts its least recently used pages. Every instance reads every segment: when the
router plans a fetch, the engine loads every page past its own that the store holds in a row,
from whichever segments hold them (the router's chosen one first), at the fabric's bandwidth.
Another instance's segment sends one transfer at a time (FIFO on its host's link: a hot prefix
held in one segment is a hot spot, which a copy may relieve); an instance's own segment is read
without its link. A transfer is booked on its sender when the request is dispatched (SGLang
prefetches from storage while the request waits). A segment dies with its instance: a
failed fault domain takes its segments' pages with it. The router's copy rounds
(:class:`router.cluster.copy_planner.CopyPlanner`, the production planner over the simulated
index) order hot prefixes into segments of other domains; a copy lands when the round orders
it (the copy's own transfer is not simulated: it runs beside the engines, as ``copy_here`` does).
A failed instance gets no new request; what it had queued still completes (counted as served)
but stores nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from radix_global.index import GlobalIndex
from radix_global.ops import IndexOp, RemovePages, StorePages
from radix_global.pool_ids import segment_pool_id
from radix_global.types import HolderId, Location, Namespace, PageKey, PoolId, Tier, WorkerId
from radix_global_tools.simulate.config import Calibration
from radix_global_tools.simulate.instances import PageCache
from router.cluster.copy_planner import (
    CopyConfig,
    CopyOutcome,
    CopyPlanner,
    Target,
    run_holders,
)
from router.routing.contract import FetchPiece
from router.routing.cost import CostModel

STORE = "mooncake-sim"


@dataclass(frozen=True)
class FaultDomains:
    """Where the simulated instances are and what happens to them: instance ``i`` in
    ``domains[i]``, copies as the router's ``copies`` options (``interval_s`` 0: off), and
    ``fail`` failing at ``fail_at_s`` (None: nothing fails) and coming back, empty, at
    ``back_at_s`` (None: never)."""

    domains: tuple[str, ...]
    copies: CopyConfig = field(default_factory=CopyConfig)
    fail: str | None = None
    fail_at_s: float = 0.0
    back_at_s: float | None = None


class DomainEvent(Enum):
    """In the order they happen at one instant."""

    FAIL = "fail"
    BACK = "back"
    COPY_ROUND = "copy_round"


def segment_of(worker: WorkerId) -> PoolId:
    return segment_pool_id(STORE, worker)


class Segments:
    """The segments of ``workers``, ``segment_tokens`` each; the same calls as
    :class:`~radix_global_tools.simulate.shared_tiers.SharedTiers`, the writer named."""

    def __init__(self, namespace: Namespace, cal: Calibration, workers: Sequence[WorkerId],
                 segment_tokens: int) -> None:
        self.cal, self.namespace = cal, namespace
        self.segment_pages = max(1, segment_tokens // cal.page_tokens)
        self.caches: dict[PoolId, PageCache] = {}
        self.sending_until: dict[PoolId, float] = {}  # each segment's link, busy until then
        self._where: dict[PageKey, set[PoolId]] = {}  # page -> the segments holding it
        for w in workers:
            self.add(w)

    def add(self, worker: WorkerId) -> None:
        """``worker``'s segment, empty (at the start, or when its host comes back)."""
        seg = segment_of(worker)
        self.caches[seg] = PageCache(self.namespace, Location(seg, 0, Tier.POOL),
                                     self.segment_pages)
        self.sending_until.pop(seg, None)

    def _insert(self, seg: PoolId, keys: Sequence[PageKey], start: int = 0) -> list[IndexOp]:
        ops = self.caches[seg].insert(keys, start)
        for op in ops:
            if isinstance(op, StorePages):
                for k in op.keys:
                    self._where.setdefault(k, set()).add(seg)
            elif isinstance(op, RemovePages):
                for k in op.keys:
                    if (held := self._where.get(k)) is not None:
                        held.discard(seg)
                        if not held:
                            del self._where[k]
        return ops

    def pool_of(self, worker: WorkerId) -> PoolId | None:
        seg = segment_of(worker)
        return seg if seg in self.caches else None

    @property
    def disk_id(self) -> PoolId | None:
        return None

    def price_on(self, cost: CostModel) -> None:
        """Every segment is read at the fabric's bandwidth: the cost model's default and its
        remote-segment link, both the fabric's (``experiments.make_cost``)."""

    def fetch(self, keys: Sequence[PageKey], local_pages: int, wanted_pages: int,
              holder: PoolId | None, touch: bool, now: float = 0.0,
              reader: WorkerId | None = None,
              pieces: Sequence[FetchPiece] = ()) -> tuple[int, float]:
        """As :meth:`SharedTiers.fetch`, when the router planned a fetch from the segment
        ``holder`` (gone or None: nothing). The engine then loads every page past its own that
        the store holds in a row (SGLang asks the store which leading pages exist, and Mooncake
        answers for every segment: ``wanted_pages``, the router's plan from one segment, may
        be fewer), each page from the segment the router planned it from if that one has it
        (the piece of ``pieces`` that covers it, else ``holder``), else from the segment that
        does. The segments send in parallel, each after the transfers it is still sending to
        others; ``touch``: this one is booked on them too."""
        if not pieces and (holder is None or holder not in self.caches):
            return 0, 0.0
        loaded: dict[PoolId, list[PageKey]] = {}
        for page in range(local_pages, len(keys)):
            where = self._where.get(keys[page])
            if not where:
                break
            planned = next((p.holder for p in pieces if p.first_page <= page < p.end_page),
                           holder)
            loaded.setdefault(planned if planned in where else min(where), []).append(keys[page])
        if touch:
            for seg, got in loaded.items():
                self.caches[seg].touch(got)
        own = segment_of(reader) if reader is not None else None
        took = 0.0
        for seg, got in loaded.items():
            transfer = self.cal.fetch_s(len(got) * self.cal.page_tokens)
            if seg == own:  # one's own segment: no link
                took = max(took, transfer)
                continue
            done = max(now, self.sending_until.get(seg, 0.0)) + transfer
            if touch:
                self.sending_until[seg] = done
            took = max(took, done - now)
        return sum(len(got) for got in loaded.values()), took

    def store(self, keys: Sequence[PageKey], writer: WorkerId) -> list[IndexOp]:
        """A computed prompt's pages, into its writer's segment, past the leading pages the
        store already holds in any segment: as SGLang's write-through asks the store which
        leading pages exist (our backend's ``batch_exists``, Mooncake's exists check over every
        segment) and writes only the rest, so a fetched prefix is not written again."""
        cache = self.caches.get(segment_of(writer))
        if cache is None:
            return []
        start = 0
        while start < len(keys) and keys[start] in self._where:
            start += 1
        cache.touch(keys[:start])  # the writer used them (those its segment holds)
        if start == len(keys):
            return []
        # Mooncake's placement: the writer's segment is preferred; where it has no room and
        # another has, the pages go there (an eviction only when no segment has room)
        def free(c: PageCache) -> int:
            return c.capacity_pages - len(c)

        need = len(keys) - start
        if free(cache) < need:
            roomiest = max(self.caches.values(), key=free)
            if free(roomiest) >= need:
                cache = roomiest
        return self._insert(PoolId(cache.location.holder), keys, start)

    def copy(self, keys: Sequence[PageKey], target: PoolId) -> list[IndexOp]:
        return self._insert(target, keys) if target in self.caches else []

    def drop(self, worker: WorkerId) -> PoolId | None:
        """The segment of a failed instance is gone; its id (the index drops its holder)."""
        seg = segment_of(worker)
        if self.caches.pop(seg, None) is None:
            return None
        self.sending_until.pop(seg, None)
        for key in [k for k, held in self._where.items() if seg in held]:
            self._where[key].discard(seg)
            if not self._where[key]:
                del self._where[key]
        return seg

    def pages(self) -> Mapping[PoolId, int]:
        return {seg: len(cache) for seg, cache in self.caches.items()}


class DomainRounds:
    """The router's copy rounds and the failure, as timed events on the simulated clock: what
    :class:`router.cluster.domain_copies.DomainCopies` does each round, over the simulated index
    and segments (the router remembers every prompt's tokens here)."""

    def __init__(self, spec: FaultDomains, workers: Sequence[WorkerId], segments: Segments,
                 index: GlobalIndex, namespace: Namespace, top_k: int = 16) -> None:
        if len(spec.domains) != len(workers):
            raise ValueError(f"{len(workers)} instances, {len(spec.domains)} domains")
        self.spec, self.segments, self.index = spec, segments, index
        self.namespace, self.top_k = namespace, top_k
        self.domain = dict(zip(workers, spec.domains, strict=True))
        self.planner = CopyPlanner(spec.copies)
        self.outcomes: Counter[CopyOutcome] = Counter()
        self.dead: set[WorkerId] = set()

    def times(self, until_s: float) -> list[tuple[float, DomainEvent]]:
        """Every event up to ``until_s``, by time."""
        spec, out = self.spec, []
        if spec.fail is not None:
            out.append((spec.fail_at_s, DomainEvent.FAIL))
            if spec.back_at_s is not None:
                out.append((spec.back_at_s, DomainEvent.BACK))
        step = spec.copies.interval_s
        if step > 0:
            out += [(k * step, DomainEvent.COPY_ROUND)
                    for k in range(1, int(until_s / step) + 1)]
        order = list(DomainEvent)
        return sorted(out, key=lambda e: (e[0], order.index(e[1])))

    def domain_of(self, holder: HolderId) -> str | None:
        worker = WorkerId(holder.split("@", 1)[1] if "@" in holder else holder)
        return self.domain.get(worker)

    def copy_round(self, now: float) -> list[IndexOp]:
        ns = self.namespace
        holders = run_holders(self.index, ns, now)
        alive = {segment_of(w) for w in self.domain if w not in self.dead}
        self.planner.settle(lambda c: c.target in holders(c.keys), alive.__contains__, now)
        targets = [Target(w, segment_of(w), d) for w, d in self.domain.items()
                   if w not in self.dead]
        orders, outcomes = self.planner.plan(
            ns, now, self.index.hot_prefixes(ns, self.top_k, now), holders,
            self.domain_of, targets, lambda keys: True,
            self.segments.segment_pages * len(self.segments.caches))
        self.outcomes.update(outcomes)
        ops: list[IndexOp] = []
        for order in orders:
            ops += self.segments.copy(order.keys, order.target.pool_id)
        return ops

    def fail(self) -> set[WorkerId]:
        """The failing domain's instances die: their local caches and segments leave the
        index (the router removes the workers), their segments' pages are gone."""
        gone = {w for w, d in self.domain.items() if d == self.spec.fail} - self.dead
        for worker in gone:
            self.index.remove_holder(worker)
            if (seg := self.segments.drop(worker)) is not None:
                self.index.remove_holder(seg)
        self.dead |= gone
        return gone

    def back(self) -> set[WorkerId]:
        """The failed domain's instances are back, their caches and segments empty: the copy
        rounds that follow order the hot prefixes into them again (the rebalancing)."""
        back, self.dead = set(self.dead), set()
        for worker in back:
            self.segments.add(worker)
        return back
