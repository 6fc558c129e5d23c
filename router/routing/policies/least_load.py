"""``least_load``: the slot with the fewest outstanding requests (cache-blind load balancing).

Load = :func:`router.routing.contract.slot_load`; ties go to the smallest predicted queue time, then
rotate so that an idle cluster is still spread.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.contract import (
    ClusterView,
    Decision,
    RouteRequest,
    RoutingPolicy,
    WorkerState,
    no_workers,
    prefill_candidates,
    route_to,
    slot_load,
)


class LeastLoadPolicy(RoutingPolicy):
    name = "least_load"

    def __init__(self) -> None:
        self._turn = 0

    def choose(
        self, req: RouteRequest, workers: Sequence[WorkerState], view: ClusterView, now: float
    ) -> Decision:
        candidates = prefill_candidates(req, workers)
        if not candidates:
            return no_workers(req, self.name)
        n = len(candidates)
        ranked = min(
            range(n),
            key=lambda i: (
                slot_load(candidates[i], view),
                view.cost.queue_s(candidates[i], now),
                (i - self._turn) % n,
            ),
        )
        return route_to(req, self.name, candidates[ranked], view, now)

    def on_routed(self, req: RouteRequest, decision: Decision, now: float) -> None:
        self._turn += 1
