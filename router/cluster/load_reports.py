"""Which holder a load a worker reports came from: the router's own plans (``docs/interfaces.md``,
"Where hosts are", "Measured loads"), and what those loads teach the topology.

The backend that timed a load knows its pages and how long they took, not which holder served
them; the router that planned the fetch knows the holder. Each planned pool fetch records its
pages' keys -> (holder, worker) under the worker's pool id, for ``ttl_s`` and at most
``max_keys`` keys (the oldest go first). Pure: time is passed in.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter

from radix_global.pool_loads import PoolLoadReport
from radix_global.types import PageKey, PoolId, WorkerId
from router.cluster.places import Places
from router.routing.contract import Decision, RouteRequest


class LoadOutcome(StrEnum):
    """What became of one reported load (``radix_global_pool_loads_total{outcome}``)."""

    APPLIED = "applied"  # a link of the topology moved towards it
    UNATTRIBUTED = "unattributed"  # not a fetch this router planned
    NOT_PLACED = "not_placed"  # planned, but its holder or worker is not in the topology
    # it runs past its piece of a fetch over several segments: whose link it measured is unknown
    MIXED = "mixed"


class Planned(NamedTuple):
    holder: PoolId
    worker: WorkerId
    at: float
    pages_left: int | None = None  # a store fetch's piece: its pages from this key on


class PlannedFetches:
    def __init__(self, ttl_s: float = 60.0, max_keys: int = 65_536) -> None:
        if ttl_s <= 0 or max_keys < 1:
            raise ValueError("ttl_s must be > 0 and max_keys >= 1")
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._keys: OrderedDict[tuple[str, PageKey], Planned] = OrderedDict()

    def add(self, pool_id: str, keys: Sequence[PageKey], holder: PoolId, worker: WorkerId,
            now: float, piece: bool = False) -> None:
        """``worker`` (whose own pool is ``pool_id``) is to load ``keys`` from ``holder``;
        ``piece``: they are one piece of a fetch over several segments, and a load is that
        segment's only while it stays within them."""
        kept = keys[-self.max_keys:]
        for i, key in enumerate(kept):
            self._keys[(pool_id, key)] = Planned(holder, worker, now,
                                                 len(kept) - i if piece else None)
            self._keys.move_to_end((pool_id, key))
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    def source(self, pool_id: str, first: PageKey, now: float) -> Planned | None:
        """The plan a load into ``pool_id`` that began at page ``first`` followed, if any."""
        self._expire(now)
        return self._keys.get((pool_id, first))

    def __len__(self) -> int:
        return len(self._keys)

    def _expire(self, now: float) -> None:
        while self._keys:
            _, planned = next(iter(self._keys.items()))
            if now - planned.at <= self.ttl_s:
                return
            self._keys.popitem(last=False)


class LoadReports:
    """Plans in, reports out: measured loads move the topology's links (:class:`Places`)."""

    def __init__(self, places: Places, planned: PlannedFetches | None = None) -> None:
        self.places = places
        self.planned = planned or PlannedFetches()
        self.outcomes: Counter[LoadOutcome] = Counter()
        self._metric: PromCounter | None = None
        self._seconds: PromCounter | None = None
        self._bytes: PromCounter | None = None

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        self._metric = PromCounter("radix_global_pool_loads",
                                   "Pool loads workers reported, by what the router made of them",
                                   ["outcome"], registry=registry)
        self._seconds = PromCounter("radix_global_pool_load_seconds", "Time pool reads took, "
                                    "as the reporting pool backend timed them", ["pool"],
                                    registry=registry)
        self._bytes = PromCounter("radix_global_pool_loaded_bytes", "Bytes of pool reads, as "
                                  "the reporting pool backend counted them", ["pool"],
                                  registry=registry)

    def fetch_planned(self, pool_id: str | None, req: RouteRequest, decision: Decision,
                      now: float) -> None:
        """``decision`` sends ``req`` to a worker whose own pool is ``pool_id``, to load its
        pages past what it holds from ``decision.fetch_from``."""
        if pool_id is None or decision.fetch_from is None or decision.worker_id is None:
            return
        for piece in decision.fetch_pieces:  # a store's run: each piece from its segment
            self.planned.add(pool_id, req.page_keys[piece.first_page:piece.end_page],
                             piece.holder, decision.worker_id, now, piece=True)
        if decision.fetch_pieces:
            return
        ps = req.page_size
        start = (decision.prefix_tokens - decision.fetch_tokens) // ps
        end = -(-decision.prefix_tokens // ps)
        self.planned.add(pool_id, req.page_keys[start:end], decision.fetch_from,
                         decision.worker_id, now)

    def apply(self, report: PoolLoadReport, now: float) -> Counter[LoadOutcome]:
        """What became of each load in ``report``."""
        outcomes: Counter[LoadOutcome] = Counter()
        for load in report.loads:
            planned = self.planned.source(report.pool_id, PageKey(load.first), now)
            if planned is None:
                outcome = LoadOutcome.UNATTRIBUTED
            elif planned.pages_left is not None and load.pages > planned.pages_left:
                outcome = LoadOutcome.MIXED
            elif self.places.observe(planned.holder, planned.worker, load.bytes, load.seconds):
                outcome = LoadOutcome.APPLIED
            else:
                outcome = LoadOutcome.NOT_PLACED
            outcomes[outcome] += 1
        self.outcomes.update(outcomes)
        if self._metric is not None and self._seconds is not None and self._bytes is not None:
            for outcome, n in outcomes.items():
                self._metric.labels(outcome.value).inc(n)
            if report.loads:
                self._seconds.labels(report.pool_id).inc(sum(ld.seconds for ld in report.loads))
                self._bytes.labels(report.pool_id).inc(sum(ld.bytes for ld in report.loads))
        return outcomes
