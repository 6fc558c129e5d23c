"""Hot-prefix warming: spread a hot prefix whose every copy sits on a busy slot.

Input: the index's hot prefixes (``GlobalIndex.hot_prefixes``), the slots, and their loads.
For a prefix that is hot (``min_hit_rate``), long enough (``min_pages``), held (at GPU/host) by
fewer than ``max_replicas`` slots, and whose holders are all busy (outstanding requests at least
``busy_margin`` above the least-loaded slot), the planner proposes warming it on the least-loaded
slot that does not hold it. Actions are paced by a token bucket of pages (``rate_pages_per_s``,
``burst_pages``) refilled by ``now``, and the same (prefix, slot) is not proposed again within
``cooldown_s``. The caller executes an action (a 1-token request with the prefix, or an L3
prefetch) and the engine's KV events then make the copy visible to the index. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, NamedTuple

from radix_global.ops import HotPrefix, IndexRefusal
from radix_global.options import opt
from radix_global.types import Namespace, PageKey, Role, WorkerId
from router.routing.contract import IndexView, Slot, WorkerState


@dataclass(frozen=True)
class WarmConfig:
    """Hot-prefix warming onto lightly loaded workers.

    ``RouterConfig.warm``, options ``warm_*``; the warmer (router/cluster/warming.py) runs a
    round every ``interval_s``."""

    interval_s: Annotated[float, opt(
        "hot-prefix warming round every this many seconds; 0 = off", ge=0)] = 0.0
    min_hit_rate: Annotated[float, opt(
        "warm prefixes at least this hot (decayed hits per second)", ge=0,
        name="warm_min_hit_rate_per_s")] = 0.2
    min_pages: Annotated[int, opt("... and at least this long", ge=0)] = 2
    max_replicas: Annotated[int, opt("... held by fewer slots than this", ge=1)] = 4
    busy_margin: Annotated[int, opt(
        "... whose holders all have this many more requests than the lightest", ge=0)] = 2
    rate_pages_per_s: Annotated[float, opt(
        "warming rate (token bucket refill)", ge=0)] = 64.0
    burst_pages: Annotated[float, opt("warming burst (token bucket size)", ge=0)] = 256.0
    cooldown_s: Annotated[float, opt(
        "no second warm of one prefix on one slot within this", ge=0)] = 30.0

    def __post_init__(self) -> None:
        if self.rate_pages_per_s < 0 or self.burst_pages < 0 or self.max_replicas < 1:
            raise ValueError("need rate_pages_per_s >= 0, burst_pages >= 0, max_replicas >= 1")


class WarmAction(NamedTuple):
    namespace: Namespace
    keys: tuple[PageKey, ...]  # the prefix to warm, root first
    worker_id: WorkerId
    dp_rank: int
    hit_rate: float
    holders: int  # slots holding it (GPU/host) when planned


class WarmupPlanner:
    def __init__(self, config: WarmConfig | None = None) -> None:
        self.config = config or WarmConfig()
        self._tokens = self.config.burst_pages
        self._refilled_at: float | None = None
        self._recent: dict[tuple[PageKey, Slot], float] = {}  # (last key, slot) -> planned at
        self.throttled = 0  # plan() calls cut short for lack of rate budget
        self.too_large = 0  # prefixes longer than the bucket

    def plan(
        self,
        namespace: Namespace,
        hot: Sequence[HotPrefix],
        workers: Sequence[WorkerState],
        loads: Mapping[Slot, int],
        index: IndexView,
        now: float,
    ) -> list[WarmAction]:
        """Actions to run now. ``loads``: outstanding requests per slot (``slot_load``).
        ``index`` tells which slots hold each prefix (one ``match`` per candidate prefix)."""
        self._refill(now)
        self._expire(now)
        slots = [w for w in workers if w.accepting and w.namespace == namespace
                 and w.role != Role.DECODE]
        if not slots:
            return []
        actions: list[WarmAction] = []
        floor = min(loads.get(w.slot, 0) for w in slots)
        for prefix in sorted(hot, key=lambda p: -p.hit_rate):
            if prefix.hit_rate < self.config.min_hit_rate or prefix.pages < self.config.min_pages:
                continue
            if prefix.pages > self.config.burst_pages:
                self.too_large += 1  # could never be paid for; counted, not planned
                continue
            holders = self._holders(namespace, prefix, index, now)
            if holders is None or len(holders) >= self.config.max_replicas:
                continue
            if any(loads.get(s, 0) < floor + self.config.busy_margin for s in holders):
                continue  # some copy is on a slot with spare capacity: routing will use it
            target = self._target(prefix, slots, holders, loads, now)
            if target is None:
                continue
            if self._tokens < prefix.pages:
                self.throttled += 1
                break  # rate spent: hotter prefixes went first, the rest waits for refill
            self._tokens -= prefix.pages
            self._recent[(prefix.keys[-1], target.slot)] = now
            actions.append(WarmAction(namespace, prefix.keys, target.worker_id, target.dp_rank,
                                      prefix.hit_rate, len(holders)))
        return actions

    def _holders(
        self, namespace: Namespace, prefix: HotPrefix, index: IndexView, now: float
    ) -> set[Slot] | None:
        try:
            match = index.match(namespace, prefix.keys, now)
        except IndexRefusal:
            return None
        # Only worker copies count: a pool copy is reachable only by slots on that pool, and
        # fetching it still costs a transfer, which is what warming avoids.
        return {(WorkerId(str(h)), r) for (h, r), m in match.matched.items()
                if m.host >= prefix.pages}

    def _target(
        self,
        prefix: HotPrefix,
        slots: Sequence[WorkerState],
        holders: set[Slot],
        loads: Mapping[Slot, int],
        now: float,
    ) -> WorkerState | None:
        free = [w for w in slots if w.slot not in holders
                and (prefix.keys[-1], w.slot) not in self._recent]
        if not free:
            return None
        best = min(free, key=lambda w: (loads.get(w.slot, 0), w.slot))
        lightest_holder = min((loads.get(s, 0) for s in holders), default=0)
        if holders and loads.get(best.slot, 0) + self.config.busy_margin > lightest_holder:
            return None  # no slot is clearly lighter than the holders
        return best

    def _refill(self, now: float) -> None:
        if self._refilled_at is not None and now > self._refilled_at:
            gained = (now - self._refilled_at) * self.config.rate_pages_per_s
            self._tokens = min(self.config.burst_pages, self._tokens + gained)
        if self._refilled_at is None or now > self._refilled_at:
            self._refilled_at = now

    def _expire(self, now: float) -> None:
        horizon = now - self.config.cooldown_s
        for key in [k for k, t in self._recent.items() if t <= horizon]:
            del self._recent[key]
