"""The router's slot tables (``router/cluster/slots.py``): one per model, rebuilt when who may be
routed to changes (a join, a leave, a drain, a worker back), the load view laid over the slots
it knows load on; a retry's excluded workers get a list built for it, as before."""

from __future__ import annotations

from radix_global.registration import WorkerInfo
from radix_global.types import WorkerId
from router.cluster.engine_loads import EngineLoad
from router.cluster.registry import Source, WorkerRegistry
from router.cluster.slots import SlotTables, worker_states
from router.routing.contract import Slot
from router.routing.load_view import NO_LOAD, SlotLoad
from router.routing.slot_table import SlotTable


class _View:
    def __init__(self) -> None:
        self.peers: dict[Slot, SlotLoad] = {}
        self.engines: dict[Slot, EngineLoad] = {}

    def peer(self, slot: Slot) -> SlotLoad:
        return self.peers.get(slot, NO_LOAD)

    def engine(self, slot: Slot) -> EngineLoad | None:
        return self.engines.get(slot)

    def loaded(self) -> list[Slot]:
        return [*self.peers, *self.engines]


def _info(worker: str, model: str = "m", dp: int = 1) -> WorkerInfo:
    return WorkerInfo(worker_id=worker, url=f"http://{worker}", model=model,
                      namespace=f"{model}@1", page_size=16, dp_size=dp)


def test_a_table_is_rebuilt_when_membership_moves_and_carries_the_view() -> None:
    registry, view = WorkerRegistry(), _View()
    tables = SlotTables(registry, view)
    registry.add(_info("a", dp=2), Source.CLI, 0.0)
    registry.add(_info("b"), Source.CLI, 0.0)
    registry.add(_info("z", model="other"), Source.CLI, 0.0)
    first = tables.slots("m")
    assert isinstance(first, SlotTable)
    assert list(first) == worker_states(registry.for_model("m"))
    assert tables._tables["m"] is tables._tables["m"]  # kept between decisions
    view.peers[(WorkerId("b"), 0)] = SlotLoad(2, 1, 300)
    view.engines[(WorkerId("a"), 1)] = EngineLoad(1, 2, 3, 4, 0.0)
    assert list(tables.slots("m")) == worker_states(registry.for_model("m"), view=view)
    built = tables._tables["m"]
    registry.drain("b")  # a drain rebuilds it: b stops taking prefills
    now = tables.slots("m")
    assert tables._tables["m"] is not built
    assert list(now) == worker_states(registry.for_model("m"), view=view)
    assert [s.accepting for s in now] == [True, True, False]
    registry.add(_info("b"), Source.CLI, 1.0)  # back
    assert all(s.accepting for s in tables.slots("m"))
    registry.remove("a")
    assert [s.worker_id for s in tables.slots("m")] == ["b"]


def test_a_retry_gets_a_list_without_the_excluded_workers() -> None:
    registry = WorkerRegistry()
    registry.add(_info("a"), Source.CLI, 0.0)
    registry.add(_info("b"), Source.CLI, 0.0)
    tables = SlotTables(registry)
    slots = tables.slots("m", {"a"})
    assert not isinstance(slots, SlotTable)
    assert [(s.worker_id, s.accepting) for s in slots] == [("a", False), ("b", True)]
