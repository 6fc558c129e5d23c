"""The prefill candidates of one namespace ordered as the conductor's shortlist ranks idle ones
(``docs/interfaces.md``, "Several routers, one view", the slot table). Pure.

A slot with nothing in flight from any router, nothing queued on its server and no engine
report of load is priced by its queue alone, and that queue is what its worker's learned fit adds
(``CostView.idle_queue_s``), which changes only when the fit does. The shortlist ranks the slots
without a prefix match by (queue, load, rotation from the policy's turn); among idle ones that is
(idle queue, rotation). :class:`IdleSlots` keeps every candidate's (idle queue, position) sorted,
so the first ``k`` in that order are found in ``O(k log n)`` plus the busy ones skipped, while the
busy slots (a few, under the load that makes them busy) are priced one by one as before.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Container, Sequence
from itertools import chain


class IdleSlots:
    """``costs[i]``: the idle queue of candidate ``i`` (slot order)."""

    def __init__(self, costs: Sequence[float]) -> None:
        self._cost = list(costs)
        self._sorted = sorted((c, i) for i, c in enumerate(self._cost))

    def __len__(self) -> int:
        return len(self._cost)

    def cost(self, position: int) -> float:
        return self._cost[position]

    def update(self, position: int, cost: float) -> None:
        old = self._cost[position]
        if old == cost:
            return
        del self._sorted[bisect_left(self._sorted, (old, position))]
        self._cost[position] = cost
        insort(self._sorted, (cost, position))

    def first(self, k: int, turn: int, skip: Container[int]) -> list[int]:
        """Up to ``k`` positions not in ``skip``, the smallest by (idle queue, ``(position -
        turn) % n``): equal costs are taken in rotation from ``turn``, as the shortlist's ties
        are."""
        out: list[int] = []
        s, n = self._sorted, len(self._cost)
        if n == 0 or k <= 0:
            return out
        start_at = turn % n
        j = 0
        while j < len(s):
            cost = s[j][0]
            end = bisect_right(s, (cost, n), j)  # positions are < n: the end of this cost
            mid = bisect_left(s, (cost, start_at), j, end)
            for idx in chain(range(mid, end), range(j, mid)):
                position = s[idx][1]
                if position not in skip:
                    out.append(position)
                    if len(out) == k:
                        return out
            j = end
        return out
