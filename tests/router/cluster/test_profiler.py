"""A prefill profile's life cycle in the router (router/cluster/profiling.py ``Profiler``), with
the other routers as a fake :class:`ProfileShare`: no HTTP, no event loop (nothing is measured
outside one, so ``start`` is a no-op here and the life cycle around it is what is tested)."""

from __future__ import annotations

import httpx
import pytest

from radix_global.registration import WorkerInfo
from radix_global.types import WorkerId
from router.cluster.profiling import Profiler, ProfileState, ProfilingConfig
from router.cluster.registry import Source, WorkerRegistry
from router.routing.cost import CostModel

COEF = (0.02, 0.4, 0.003, 0.05)


class Share:
    def __init__(self, leader: bool = True, known: tuple[float, ...] | None = None) -> None:
        self.leader, self.known = leader, known
        self.fitted: list[tuple[str, str, tuple[float, ...]]] = []

    def leads(self) -> bool:
        return self.leader

    def fitted_elsewhere(self, worker_id: str, namespace: str) -> tuple[float, ...] | None:
        return self.known

    def fitted_here(self, worker_id: str, namespace: str, coef: tuple[float, ...]) -> None:
        self.fitted.append((worker_id, namespace, coef))


def setup(share: Share) -> tuple[Profiler, WorkerRegistry, CostModel]:
    registry, cost = WorkerRegistry(), CostModel()
    profiler = Profiler(ProfilingConfig(), cost, registry, httpx.AsyncClient(), share, None, 1.0)
    return profiler, registry, cost


def entry(registry: WorkerRegistry, wid: str = "w0"):
    return registry.add(WorkerInfo(worker_id=wid, url="http://127.0.0.1:9", model="tiny",
                                   namespace="tiny@1", page_size=4), Source.REGISTERED, 0.0)


def test_a_worker_the_leader_profiled_is_priced_with_that_profile_at_once():
    profiler, registry, cost = setup(Share(leader=False, known=COEF))
    profiler.joined(entry(registry))
    assert profiler.outcomes["w0"]["state"] is ProfileState.RESTORED
    assert cost.prefill_model(WorkerId("w0")).coef == pytest.approx(COEF)


def test_a_shared_profile_does_not_replace_one_measured_here_and_leaving_forgets_it():
    profiler, registry, cost = setup(Share())
    e = entry(registry)
    profiler.joined(e)  # nothing known: inherited (none) and, outside a loop, not measured
    assert "w0" not in profiler.outcomes and profiler.pending() == 0
    profiler.shared(e, COEF)
    assert profiler.outcomes["w0"]["state"] is ProfileState.SHARED
    profiler.outcomes["w0"]["state"] = ProfileState.DONE  # as a finished measurement leaves it
    profiler.shared(e, (1.0, 1.0, 1.0, 1.0))
    assert cost.prefill_model(WorkerId("w0")).coef == pytest.approx(COEF)
    profiler.outcomes["w0"]["state"] = ProfileState.RUNNING
    profiler.left("w0")  # a measurement still running must not stay pending forever
    assert profiler.pending() == 0 and "w0" not in profiler.outcomes
