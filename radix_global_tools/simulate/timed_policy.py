"""A policy wrapper that times each decision (the simulator reports decision time)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from router.routing.contract import ClusterView, Decision, RouteRequest, RoutingPolicy, WorkerState


class TimedPolicy(RoutingPolicy):
    """Delegates to a policy, recording the wall clock of its last ``choose``."""

    name = "timed"

    def __init__(self, inner: RoutingPolicy) -> None:
        self.inner = inner
        self.last_choose_s = 0.0

    def choose(
        self, req: RouteRequest, workers: Sequence[WorkerState], view: ClusterView, now: float
    ) -> Decision:
        t0 = time.perf_counter()
        decision = self.inner.choose(req, workers, view, now)
        self.last_choose_s = time.perf_counter() - t0
        return decision

    def on_routed(self, req: RouteRequest, decision: Decision, now: float) -> None:
        self.inner.on_routed(req, decision, now)

    def on_finished(self, request_id: str, ok: bool, now: float) -> None:
        self.inner.on_finished(request_id, ok, now)
