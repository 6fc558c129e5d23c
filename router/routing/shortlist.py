"""Which of a request's candidate slots the conductor prices (``router/routing/policies/
conductor.py``, whose docstring says why): every slot holding a local prefix of the request,
plus the ``k`` others with the shortest queue. Given a slot table, the idle slots come in an
order kept between decisions (:mod:`router.routing.idle_slots`), so only the busy and prefix
holding slots are looked at one by one.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain

from radix_global.ops import HolderMatch, MatchResult
from radix_global.types import HolderId, Namespace
from router.routing.contract import ClusterView, RouteRequest, Slot, WorkerState, slot_load
from router.routing.idle_slots import IdleSlots
from router.routing.routed_prefixes import RoutedPrefixes
from router.routing.slot_table import SlotTable

# (position, slot, its queue, its routed pages); None: not computed (the conductor does then)
Shortlisted = tuple[int, WorkerState, float | None, int | None]


def routed_pages(routed: RoutedPrefixes | None, worker: WorkerState, req: RouteRequest,
                 now: float, tips: dict[Slot, int] | None = None) -> int:
    """Leading pages of ``req`` routed to ``worker``'s slot, by this router or (``tips``:
    :meth:`RoutedPrefixes.tips` of ``req``) another."""
    if routed is None:
        return 0
    mine = routed.match(worker.slot, req.page_keys, now)
    return max(mine, tips.get(worker.slot, 0)) if tips else mine


class Shortlist:
    def __init__(self, routed: RoutedPrefixes | None) -> None:
        self._routed = routed
        # per namespace: the slot table's candidates it was built for, the idle order, and
        # the cost model's idle change count it has seen
        self._idle: dict[Namespace, tuple[tuple[WorkerState, ...], IdleSlots, int]] = {}

    def slots(
        self, req: RouteRequest, candidates: Sequence[WorkerState], match: MatchResult | None,
        view: ClusterView, now: float, k: int, tips: dict[Slot, int], turn: int,
        table: SlotTable | None = None,
    ) -> list[Shortlisted]:
        """(position, slot, queue, routed pages) of the slots worth pricing, in slot order: every
        local prefix holder (index or routed memory) and the ``k`` others with the shortest
        queue (then least load, then rotation from ``turn``). From a ``table``: the slots that
        may differ from idle ones, priced, and the first ``k`` idle ones in that order, not
        priced."""
        held = match.matched if match is not None else {}
        routed_slots = self._routed.slots() if self._routed is not None else frozenset()
        keep: list[Shortlisted] = []
        # (queue, load, rotation, position, slot): the order the conductor breaks ties in
        # (load, then rotation), so idle equal slots are shortlisted in the rotation the
        # exhaustive choice would follow; the rotation is unique, so the slot itself is never
        # compared.
        others: list[tuple[float, int, int, int, WorkerState]] = []
        n = len(candidates)
        walk: Iterable[int] = range(n)
        if table is not None:
            walk = self._not_idle(req, table, held, view, now, tips)
            idle = self._idle_slots(table, req.namespace, view)
            others = [(idle.cost(i), 0, (i - turn) % n, i, candidates[i])
                      for i in idle.first(k, turn, walk)]
        for i in walk:
            c = candidates[i]
            slot = c.slot
            own = held.get(slot)
            queue = view.cost.queue_s(c, now)
            routed = routed_pages(self._routed, c, req, now, tips) \
                if slot in routed_slots or slot in tips else 0
            if (own is not None and own.host > 0) or routed > 0:
                keep.append((i, c, queue, routed))
            else:
                others.append((queue, slot_load(c, view), (i - turn) % n, i, c))
        if len(others) > k:
            others = heapq.nsmallest(k, others)  # O(n log k), not a sort of every slot
        keep.extend((i, c, queue, 0) for queue, _, _, i, c in others)
        keep.sort(key=lambda t: t[0])
        return keep

    def _not_idle(self, req: RouteRequest, table: SlotTable,
                  held: Mapping[tuple[HolderId, int], HolderMatch],
                  view: ClusterView, now: float, tips: dict[Slot, int]) -> set[int]:
        """The positions of ``table``'s candidates for ``req`` that the shortlist must look at
        one by one: prefix holders, and slots with work in flight or reported (any router's,
        the engine's, their compute domain's)."""
        ns = req.namespace
        slots: list[Slot] = [s for s, m in held.items() if m.host > 0]  # type: ignore[misc]
        if self._routed is not None:
            slots += self._routed.holders(req.page_keys, now)
        busy_slots, busy_workers = view.cost.busy()
        out = {p for s in chain(slots, tips, busy_slots, table.loaded())
               if (p := table.position(ns, s)) is not None}
        per_worker = table.worker_positions(ns)
        for worker in busy_workers:
            out.update(per_worker.get(worker, ()))
        return out

    def _idle_slots(self, table: SlotTable, ns: Namespace, view: ClusterView) -> IdleSlots:
        """The idle order of ``table``'s candidates of ``ns``: built once per table, then
        updated for the workers whose fit changed since the last decision."""
        base, cost = table.base(ns), view.cost
        cached = self._idle.get(ns)
        if cached is None or cached[0] is not base:
            count, _ = cost.idle_changes(sys.maxsize)  # the count alone: nothing is newer
            idle = IdleSlots([cost.idle_queue_s(s.worker_id) for s in base])
        else:
            idle = cached[1]
            count, changed = cost.idle_changes(cached[2])
            if changed is None:  # a worker was removed: every idle queue is read again
                idle = IdleSlots([cost.idle_queue_s(s.worker_id) for s in base])
                changed = []
            per_worker = table.worker_positions(ns)
            for worker in changed:
                value = cost.idle_queue_s(worker)
                for p in per_worker.get(worker, ()):
                    idle.update(p, value)
        self._idle[ns] = (base, idle, count)
        return idle
