"""Registry entries -> the policy contract's :class:`WorkerState` slots, and the slot tables a
decision reads them from (``docs/interfaces.md``, "Several routers, one view", the slot table).

The life cycle of a request (route, prefill done, finished, worker gone) goes through
:class:`router.routing.driver.PolicyDriver`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Protocol

from radix_global.types import Namespace, PoolId, WorkerId
from router.cluster.engine_loads import EngineLoad
from router.cluster.registry import WorkerEntry, WorkerRegistry
from router.routing.contract import WorkerState
from router.routing.load_view import SlotLoad
from router.routing.queue_model import Slot
from router.routing.slot_table import SlotTable


class SlotView(Protocol):
    """The load view of a slot beyond this router's own work (docs/interfaces.md, the load
    view): the other routers' in-flight work, and the engine's report (None: unknown/stale)."""

    def peer(self, slot: Slot) -> SlotLoad: ...
    def engine(self, slot: Slot) -> EngineLoad | None: ...

    def loaded(self) -> Collection[Slot]:
        """Every slot :meth:`peer` or :meth:`engine` may say something of (a superset)."""
        ...


class SlotTables:
    """One :class:`SlotTable` per model, rebuilt when the registry's membership moves; a
    decision gets it with the load view laid over the loaded slots only."""

    def __init__(self, registry: WorkerRegistry, view: SlotView | None = None) -> None:
        self.registry, self.view = registry, view
        self._tables: dict[str, SlotTable] = {}
        self._generation = -1

    def slots(self, model: str, exclude: set[str] | None = None) -> Sequence[WorkerState]:
        """``model``'s slots now. With ``exclude`` (workers a retry must avoid): a list built
        for this one decision, as before the tables."""
        registry = self.registry
        if exclude:
            return worker_states(registry.for_model(model), exclude, self.view)
        if registry.generation != self._generation:
            self._tables.clear()
            self._generation = registry.generation
        table = self._tables.get(model)
        if table is None:
            table = self._tables[model] = SlotTable(worker_states(registry.for_model(model)))
        view = self.view
        if view is None:
            return table
        return table.with_loads(view.loaded(), lambda state: _with_load(state, view))


def worker_states(entries: Iterable[WorkerEntry], exclude: set[str] | None = None,
                  view: SlotView | None = None) -> list[WorkerState]:
    """One slot per (worker, dp rank); excluded and draining workers are not accepting.
    ``view``: the other routers' work and the engines' reports fill the slots' load fields."""
    out: list[WorkerState] = []
    for e in entries:
        i = e.info
        accepting = e.accepting and not (exclude and i.worker_id in exclude)
        for rank in range(i.dp_size):
            state = WorkerState(
                worker_id=WorkerId(i.worker_id), namespace=Namespace(i.namespace), dp_rank=rank,
                dp_size=i.dp_size, role=i.role,
                pool_id=PoolId(i.pool_id) if i.pool_id else None, url=i.url,
                accepting=accepting, pool_aliases=i.pool_aliases and i.pool_id is not None,
                pool_disk_id=PoolId(i.pool_disk_id) if i.pool_disk_id else None,
                pool_fetch_min_tokens=i.pool_fetch_min_tokens,
                pool_prefetch_budget_tokens=i.pool_prefetch_budget_tokens)
            out.append(state if view is None else _with_load(state, view))
    return out


def _with_load(state: WorkerState, view: SlotView) -> WorkerState:
    peer, engine = view.peer(state.slot), view.engine(state.slot)
    if engine is None and peer.empty:
        return state
    if engine is None:
        return state._replace(peer_requests=peer.requests, peer_prefill_tokens=peer.prefill_tokens,
                              peer_decode_tokens=peer.decode_tokens)
    return state._replace(
        peer_requests=peer.requests, peer_prefill_tokens=peer.prefill_tokens,
        peer_decode_tokens=peer.decode_tokens, running=engine.running, waiting=engine.waiting,
        waiting_tokens=engine.waiting_tokens, kv_headroom_tokens=engine.kv_headroom_tokens)
