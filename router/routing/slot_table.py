"""The slots of a cluster, kept between decisions (``docs/interfaces.md``, "Several routers, one
view", the slot table). Pure.

A decision used to build one :class:`WorkerState` per slot, then filter and sort them: work in
the number of slots before any policy looked at a request. A :class:`SlotTable` is built once per
membership change (a worker joins, leaves, drains): the slots in slot order and, per namespace,
its prefill candidates with their positions. What changes between decisions, the load the other
routers publish and the engines report on a few slots, is laid over it (:meth:`with_loads`, work
in the loaded slots only). Policies read it through
:func:`router.routing.contract.prefill_candidates` like any list; the conductor also reads the
positions and the loaded slots, to price only the slots that can differ from an idle one
(:mod:`router.routing.idle_slots`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import overload

from radix_global.types import Namespace, WorkerId
from router.routing.contract import (
    Slot,
    SlotSet,
    WorkerState,
    has_reported_load,
    takes_prefills,
)


class _Layout:
    """What a membership change rebuilds; never changed after."""

    def __init__(self, states: Iterable[WorkerState]) -> None:
        self.states = tuple(sorted(states, key=lambda s: s.slot))
        self.index = {s.slot: i for i, s in enumerate(self.states)}
        if len(self.index) != len(self.states):
            raise ValueError("a slot table lists each (worker, dp rank) once")
        by_ns: dict[Namespace, list[WorkerState]] = {}
        for s in self.states:
            if takes_prefills(s):
                by_ns.setdefault(s.namespace, []).append(s)
        self.candidates = {ns: tuple(c) for ns, c in by_ns.items()}
        self.positions = {ns: {s.slot: i for i, s in enumerate(c)}
                          for ns, c in self.candidates.items()}
        # slots built with load already on them (a caller's own states, not laid over)
        self.loaded = frozenset(s.slot for s in self.states if has_reported_load(s))
        self.worker_positions: dict[Namespace, dict[WorkerId, list[int]]] = {}
        for ns, c in self.candidates.items():
            per = self.worker_positions[ns] = {}
            for i, s in enumerate(c):
                per.setdefault(s.worker_id, []).append(i)


class _Overlaid(Sequence[WorkerState]):
    """A namespace's candidates with some positions' states replaced (their load)."""

    def __init__(self, base: tuple[WorkerState, ...], over: dict[int, WorkerState]) -> None:
        self._base, self._over = base, over

    def __len__(self) -> int:
        return len(self._base)

    @overload
    def __getitem__(self, i: int) -> WorkerState: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[WorkerState]: ...

    def __getitem__(self, i: int | slice) -> WorkerState | Sequence[WorkerState]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._base)))]
        if i < 0:
            i += len(self._base)
        return self._over.get(i) or self._base[i]

    def __iter__(self) -> Iterator[WorkerState]:
        over = self._over
        for i, s in enumerate(self._base):
            yield over.get(i) or s


class SlotTable(SlotSet):
    """Every slot of a cluster (or of one model) in slot order, with per-namespace prefill
    candidates. Build one per membership change; :meth:`with_loads` per decision."""

    def __init__(self, states: Iterable[WorkerState]) -> None:
        self._layout = _Layout(states)
        self._over: dict[Slot, WorkerState] = {}
        self._loaded: Collection[Slot] = self._layout.loaded
        self._all = _Overlaid(self._layout.states, {})

    def with_loads(self, slots: Iterable[Slot],
                   fill: Callable[[WorkerState], WorkerState]) -> SlotTable:
        """The table as built, with ``fill(state)`` in place of each of ``slots``' states (those
        it has; loads laid over before are not kept): the load fields the other routers and the
        engines report there. Costs the slots."""
        table = SlotTable.__new__(SlotTable)
        table._layout = self._layout
        index, states = self._layout.index, self._layout.states
        table._over = {slot: fill(states[index[slot]]) for slot in slots if slot in index}
        loaded = {slot for slot, state in table._over.items() if has_reported_load(state)}
        table._loaded = loaded | self._layout.loaded if self._layout.loaded else loaded
        table._all = _Overlaid(states, {index[slot]: st for slot, st in table._over.items()})
        return table

    def loaded(self) -> Collection[Slot]:
        """The slots with other routers' or an engine's load on them
        (:func:`router.routing.contract.has_reported_load`): as built or laid over."""
        return self._loaded

    # --- SlotSet ---------------------------------------------------------------------------
    def candidates(self, namespace: Namespace) -> Sequence[WorkerState]:
        base = self._layout.candidates.get(namespace, ())
        if not self._over:
            return base
        positions = self._layout.positions.get(namespace, {})
        over = {positions[slot]: state for slot, state in self._over.items()
                if slot in positions}
        return _Overlaid(base, over) if over else base

    def get(self, slot: Slot) -> WorkerState | None:
        i = self._layout.index.get(slot)
        return None if i is None else self._over.get(slot) or self._layout.states[i]

    # --- what the conductor's shortlist reads ------------------------------------------------
    def base(self, namespace: Namespace) -> tuple[WorkerState, ...]:
        """The namespace's candidates as built (no loads laid over); the same object until the
        next membership change, so a policy may key what it derives from them on it."""
        return self._layout.candidates.get(namespace, ())

    def position(self, namespace: Namespace, slot: Slot) -> int | None:
        """``slot``'s place among ``namespace``'s candidates (None: not one of them)."""
        return self._layout.positions.get(namespace, {}).get(slot)

    def worker_positions(self, namespace: Namespace) -> Mapping[WorkerId, list[int]]:
        """Per worker, the places of its slots among ``namespace``'s candidates."""
        return self._layout.worker_positions.get(namespace, {})

    # --- Sequence: every slot, loads laid over ----------------------------------------------
    def __len__(self) -> int:
        return len(self._all)

    @overload
    def __getitem__(self, i: int) -> WorkerState: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[WorkerState]: ...

    def __getitem__(self, i: int | slice) -> WorkerState | Sequence[WorkerState]:
        return self._all[i]

    def __iter__(self) -> Iterator[WorkerState]:
        return iter(self._all)
