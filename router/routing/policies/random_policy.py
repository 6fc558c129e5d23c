"""``random``: a uniformly random accepting slot (the paper's weakest baseline)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from router.routing.contract import (
    ClusterView,
    Decision,
    RouteRequest,
    RoutingPolicy,
    WorkerState,
    is_prefill_candidate,
    no_workers,
    route_to,
)


class RandomPolicy(RoutingPolicy):
    name = "random"
    places_by_state = False

    def __init__(self, seed: int | None = 0) -> None:
        self._rng = random.Random(seed)

    def choose(
        self, req: RouteRequest, workers: Sequence[WorkerState], view: ClusterView, now: float
    ) -> Decision:
        # In the caller's order, not slot order: the seeded draws stay those of recorded runs.
        candidates = [w for w in workers if is_prefill_candidate(req, w)]
        if not candidates:
            return no_workers(req, self.name)
        return route_to(req, self.name, self._rng.choice(candidates), view, now)
