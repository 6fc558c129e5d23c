"""Which hot prefixes get a copy in another fault domain, and where (``docs/interfaces.md``,
"Where hosts are", "Copies across fault domains"). Pure: the index, the places and the clock are
passed in.

A hot prefix whose whole run sits in Mooncake segments of fewer than ``domains`` fault domains
gets a copy on a worker of a domain that does not hold it: the worker, among those whose pool is
a segment of the same store, with the fewest copy pages ordered so far. Orders stay within
``max_pages`` pages of copies not yet seen gone, and within ``max_share`` of the segments'
capacity.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, NamedTuple

from radix_global.index import GlobalIndex
from radix_global.ops import HotPrefix
from radix_global.options import opt
from radix_global.pool_ids import is_store_segment, store_of
from radix_global.types import HolderId, Namespace, PageKey, PoolId, WorkerId


@dataclass(frozen=True)
class CopyConfig:
    """Copies of hot prefixes in other fault domains (router/cluster/copy_planner.py)."""

    interval_s: Annotated[float, opt(
        "a copy round every this many seconds; 0 = off", ge=0)] = 0.0
    domains: Annotated[int, opt(
        "fault domains a hot prefix's pool run should be in", ge=1)] = 2
    min_hit_rate: Annotated[float, opt(
        "copy prefixes at least this hot (decayed hits per second)", ge=0,
        name="copies_min_hit_rate_per_s")] = 0.2
    min_pages: Annotated[int, opt("... and at least this long", ge=1)] = 2
    max_pages: Annotated[int, opt(
        "pages of copies ordered and not yet seen gone, at most", ge=0)] = 65_536
    max_share: Annotated[float, opt(
        "... and at most this share of the segments' registered capacity", ge=0, le=1)] = 0.25


class CopyOutcome(StrEnum):
    ORDERED = "ordered"
    NO_TOKENS = "no_tokens"  # the router does not remember the prefix's token ids
    NO_TARGET = "no_target"  # no worker of another domain reads a segment of that store
    OVER_BUDGET = "over_budget"


class Target(NamedTuple):
    """A worker that can take a copy: its pool (a segment) and its fault domain."""

    worker_id: WorkerId
    pool_id: PoolId
    domain: str


class CopyOrder(NamedTuple):
    namespace: Namespace
    keys: tuple[PageKey, ...]  # the prefix, root first
    target: Target


class Copy(NamedTuple):
    """A copy ordered: counted against the budget while its target holds the run (or it is
    younger than the grace period: on its way), until it is promoted (:meth:`CopyPlanner.
    settle`). ``sources``: the store segments that held the run when it was ordered."""

    namespace: Namespace
    keys: tuple[PageKey, ...]
    target: PoolId
    at: float
    sources: tuple[HolderId, ...] = ()


class CopyPlanner:
    def __init__(self, config: CopyConfig) -> None:
        self.config = config
        self.copies: dict[tuple[Namespace, PageKey, PoolId], Copy] = {}

    def pages(self) -> int:
        return sum(len(c.keys) for c in self.copies.values())

    def limit(self, capacity_pages: int | None) -> int:
        """The budget in pages: ``max_pages``, and ``max_share`` of ``capacity_pages`` (the
        segments' registered capacity; None: not known)."""
        cfg = self.config
        if capacity_pages is None:
            return cfg.max_pages
        return min(cfg.max_pages, int(cfg.max_share * capacity_pages))

    def settle(self, holds: Callable[[Copy], bool], registered: Callable[[HolderId], bool],
               now: float) -> None:
        """A round's bookkeeping before it plans: promote, then forget the copies gone.

        Promote: when no source of a prefix's copies is registered any more (the original's
        worker left: its domain failed), the oldest of them its target holds becomes the
        original. It stops counting against the budget, and it is the others' source from then
        on, so the budget goes to restoring the domains (a returning rack's copy first), and
        one loss promotes one copy. A source that leaves the index but not the registry (an
        event gap, an eviction) promotes nothing."""
        by_prefix: dict[tuple[Namespace, PageKey], list[tuple[Namespace, PageKey, PoolId]]] = {}
        for key, c in self.copies.items():
            by_prefix.setdefault((c.namespace, c.keys[-1]), []).append(key)
        for keys in by_prefix.values():
            copies = [self.copies[k] for k in keys]
            if any(registered(s) for c in copies for s in c.sources):
                continue
            made = [k for k in keys if holds(self.copies[k])]
            if not made:
                continue
            promoted = self.copies.pop(min(made, key=lambda k: self.copies[k].at))
            for k in keys:
                if k in self.copies:
                    self.copies[k] = self.copies[k]._replace(sources=(promoted.target,))
        self.forget_gone(holds, now)

    def forget_gone(self, holds: Callable[[Copy], bool], now: float,
                    grace_s: float = 60.0) -> None:
        """Stop counting the copies older than ``grace_s`` whose target does not hold their run
        (evicted, never made, or the target left)."""
        self.copies = {k: c for k, c in self.copies.items()
                       if now - c.at <= grace_s or holds(c)}

    def plan(self, namespace: Namespace, now: float, hot: Sequence[HotPrefix],
             holders_of: Callable[[tuple[PageKey, ...]], Sequence[HolderId]],
             domain_of: Callable[[HolderId], str | None], targets: Sequence[Target],
             remembered: Callable[[tuple[PageKey, ...]], bool],
             capacity_pages: int | None = None
             ) -> tuple[list[CopyOrder], Counter[CopyOutcome]]:
        """The orders for ``namespace`` now. ``holders_of(keys)``: the holders of the whole run;
        ``domain_of``: a holder's fault domain (None: not placed); ``remembered(keys)``: whether
        the prefix's token ids are known (an order names storage keys); ``capacity_pages``: the
        segments' capacity (:meth:`limit`). A copy goes near the prefix's users: into a domain
        where a target worker holds the run in its own cache if there is one, there to the
        least loaded (``docs/interfaces.md``, "Where hosts are")."""
        cfg, outcomes = self.config, Counter[CopyOutcome]()
        orders: list[CopyOrder] = []
        load: Counter[WorkerId] = Counter()
        for c in self.copies.values():
            for t in targets:
                if t.pool_id == c.target:
                    load[t.worker_id] += len(c.keys)
        budget = self.limit(capacity_pages) - self.pages()
        for prefix in hot:
            if prefix.hit_rate < cfg.min_hit_rate or prefix.pages < cfg.min_pages:
                continue
            holders = set(holders_of(prefix.keys))
            segments = sorted(h for h in holders if is_store_segment(h))
            if not segments:
                continue
            # who uses the prefix: the target workers holding the whole run in their own caches
            near = {t.domain for t in targets if t.worker_id in holders}
            store = store_of(segments[0])
            ordered = [c.target for c in self.copies.values()
                       if c.namespace == namespace and c.keys[-1] == prefix.keys[-1]]
            covered = {domain_of(h) for h in [*segments, *ordered]} - {None}
            if len(covered) >= cfg.domains:
                continue
            candidates = [t for t in targets if store_of(t.pool_id) == store
                          and t.domain not in covered]
            if not candidates:
                outcomes[CopyOutcome.NO_TARGET] += 1
                continue
            if not remembered(prefix.keys):
                outcomes[CopyOutcome.NO_TOKENS] += 1
                continue
            if prefix.pages > budget:
                outcomes[CopyOutcome.OVER_BUDGET] += 1
                continue
            target = min(candidates, key=lambda t: (
                t.domain not in near, load[t.worker_id], t.worker_id))
            budget -= prefix.pages
            load[target.worker_id] += prefix.pages
            orders.append(CopyOrder(namespace, prefix.keys, target))
            self.copies[(namespace, prefix.keys[-1], target.pool_id)] = Copy(
                namespace, prefix.keys, target.pool_id, now,
                tuple(s for s in segments if s not in ordered))  # the originals
            outcomes[CopyOutcome.ORDERED] += 1
        return orders, outcomes


def run_holders(index: GlobalIndex, namespace: Namespace, now: float
                ) -> Callable[[tuple[PageKey, ...]], list[HolderId]]:
    """``holders_of(keys)`` for :meth:`CopyPlanner.plan`: the holders whose run (any tier) in
    ``index`` covers the whole prefix. The lookups count no hit: a round must not keep the
    prefixes it looks at hot."""

    def holders_of(keys: tuple[PageKey, ...]) -> list[HolderId]:
        matched = index.match(namespace, keys, now, hit=False).matched
        return [h for (h, _), hit in matched.items() if hit.pool >= len(keys)]

    return holders_of
