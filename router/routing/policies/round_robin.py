"""``round_robin``: accepting slots in turn, ordered by (worker id, dp rank)."""

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
)


class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"
    places_by_state = False

    def __init__(self) -> None:
        self._turn = 0  # advanced in on_routed, so a rejected/unforwarded decision costs no turn

    def choose(
        self, req: RouteRequest, workers: Sequence[WorkerState], view: ClusterView, now: float
    ) -> Decision:
        candidates = prefill_candidates(req, workers)
        if not candidates:
            return no_workers(req, self.name)
        return route_to(req, self.name, candidates[self._turn % len(candidates)], view, now)

    def on_routed(self, req: RouteRequest, decision: Decision, now: float) -> None:
        self._turn += 1
