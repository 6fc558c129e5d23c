"""One entry point for callers (HTTP router, simulator): route, then report progress.

``PolicyDriver`` runs a policy's ``choose``, pairs a decode slot when the chosen prefill slot is a
disaggregated prefill worker, applies the TBT/decode-KV admission, and on acceptance records the
request in the cost model (queue), the policy (its private state) and the decode reservations.
The caller then forwards and later reports ``prefill_done`` and ``finished`` (or ``finished`` with
``ok=False`` when forwarding failed). Every method takes ``now``; nothing here does I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from radix_global.types import PageKey, Role, WorkerId
from router.routing.admission import SloConfig, reject
from router.routing.contract import (
    ClusterView,
    Decision,
    IndexView,
    RejectReason,
    RouteRequest,
    RoutingPolicy,
    Slot,
    SlotSet,
    WorkerState,
    is_prefill_candidate,
)
from router.routing.cost import CostModel
from router.routing.decode_select import DecodeSelector
from router.routing.dispatch_gate import DispatchGate

log = logging.getLogger("radix_global.router.dispatch")


class PolicyDriver:
    def __init__(
        self,
        policy: RoutingPolicy,
        cost: CostModel,
        index: IndexView | None = None,
        decode: DecodeSelector | None = None,
        slo: SloConfig | None = None,
        gate: DispatchGate | None = None,
    ) -> None:
        self.policy = policy
        self.cost = cost
        self.view = ClusterView(index=index, cost=cost)
        self.decode = decode or DecodeSelector()
        self.slo = slo or SloConfig()
        self._requests: dict[str, RouteRequest] = {}
        # Router-side dispatch (docs/interfaces.md,
        # "Router-side dispatch: holding requests while the engines are busy"): told where released
        # requests went and when their prefill ended; ``on_room`` is called when that made room at
        # the gate.
        self.gate = gate
        self.on_room: Callable[[], None] | None = None
        # called when this router's in-flight work changed (routed, first token, ended): the
        # shared load view publishes it (router/coordination/link.py)
        self.on_change: Callable[[], None] | None = None
        # called with the slot and the prompt's page keys of each request routed: the shared
        # load view tells the other routers where its prefix went
        self.on_routed: Callable[[Slot, Sequence[PageKey]], None] | None = None
        # called with each accepted request that plans a pool fetch: the router remembers which
        # holder its pages are to come from (router/cluster/load_reports.py)
        self.on_fetch: Callable[[RouteRequest, Decision, float], None] | None = None

    def estimate(self, req: RouteRequest, workers: Sequence[WorkerState], now: float
                 ) -> Decision:
        """The policy's decision for ``req`` now, recorded nowhere (a request about to be held:
        its predicted work, or its rejection)."""
        return self.policy.choose(req, workers, self.view, now)

    def route(self, req: RouteRequest, workers: Sequence[WorkerState], now: float) -> Decision:
        """Decide and, if accepted, record the request as routed. A caller that then fails to
        forward it must call ``finished(request_id, ok=False, now)``. A request the dispatch
        gate released to a server goes to one of that server's slots: the room it took is
        there, and the policy, asked again a moment later, may prefer a server that has none
        (while that server has a slot among ``workers``)."""
        candidates = workers
        if self.gate is not None and (target := self.gate.released_to(req.request_id)) \
                is not None:
            server = self.cost.queue.server  # decode workers stay in ``workers``: PD picks one
            candidates = [w for w in workers if server(w.slot) == target
                          and is_prefill_candidate(req, w)] or workers
        decision = self.policy.choose(req, candidates, self.view, now)
        if not decision.accepted:
            return decision
        chosen = workers.get(decision.slot) if isinstance(workers, SlotSet) \
            else next((w for w in workers if w.slot == decision.slot), None)
        if chosen is not None and chosen.role == Role.PREFILL:
            pick = self.decode.choose(req, workers, self.slo.tbt_for(req))
            if not pick.accepted:
                retry = self.slo.retry_after_s(0.0)
                return reject(req, decision.policy, pick.reason or RejectReason.NO_WORKERS,
                              retry, decision.candidates)
            if pick.worker_id is not None:
                decision = decision._replace(
                    decode_worker_id=pick.worker_id, decode_dp_rank=pick.dp_rank
                )
                self.decode.reserve(
                    req.request_id, (pick.worker_id, pick.dp_rank), pick.reserve_tokens
                )
        self._requests[req.request_id] = req
        if self.gate is not None:
            self.gate.placed(req.request_id, self.cost.queue.server(decision.slot))
        self.cost.on_routed(req, decision, now, chosen.pool_id if chosen is not None else None)
        self.policy.on_routed(req, decision, now)
        if self.on_routed is not None and req.page_keys:
            self.on_routed(decision.slot, req.page_keys)
        if self.on_fetch is not None and decision.fetch_from is not None:
            self.on_fetch(req, decision, now)
        self._changed()
        return decision

    def prefill_done(self, request_id: str, now: float, prefill_s: float | None = None) -> None:
        """First token seen (``prefill_s``: measured prefill compute time, if known)."""
        self.cost.on_prefill_done(request_id, now, prefill_s)
        self._changed()
        if self.gate is not None and self.gate.first_token(request_id):
            self._room()

    def finished(self, request_id: str, ok: bool, now: float) -> None:
        """The request ended (completed, failed, cancelled, or never forwarded). Idempotent."""
        self.cost.on_finished(request_id, now)
        self.decode.release(request_id)
        self._changed()
        if self._requests.pop(request_id, None) is not None:
            self.policy.on_finished(request_id, ok, now)
        if self.gate is not None and self.gate.drop(request_id):
            self._room()  # last: the held are priced against the policy's state after this

    def worker_removed(self, worker_id: WorkerId) -> None:
        self.cost.on_worker_removed(worker_id)
        self.decode.forget_worker(worker_id)
        self.policy.on_worker_removed(worker_id)

    def peers_changed(self) -> None:
        """Other routers' published work changed (the shared load view): a prefill of theirs
        that ended may have made room for a request held here, which must not wait for this
        router's next event or the dispatcher's tick."""
        self._room()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _room(self) -> None:
        if self.on_room is None:
            return
        try:
            self.on_room()
        except Exception:  # the gate's trouble must not fail the request that made room
            log.exception("dispatch after a first token or an end failed")

    def in_flight(self) -> int:
        return len(self._requests)
