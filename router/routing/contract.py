"""The routing contract: what a policy is given, what it answers, and how it learns.

Everything here is pure (no I/O, no clock): the HTTP router (``router/http/app.py``) and the cluster
simulator (``radix_global_tools/simulate/``) drive the same policies, passing the time as ``now``.

Life of one request (the caller's side; :class:`router.routing.driver.PolicyDriver` does all of
it in one place, use it rather than calling the pieces):

1. build a :class:`RouteRequest` (page keys from ``radix_global.keys``) and the list of
   :class:`WorkerState` (one per (worker, dp_rank) slot);
2. ``decision = policy.choose(req, workers, view, now)``;
3. if ``decision.accepted``: forward to ``decision.worker`` (with ``data_parallel_rank`` =
   ``decision.dp_rank`` when the worker has ``dp_size > 1``), then report ``on_routed``;
   else answer 429 with ``Retry-After: decision.retry_after_s``;
4. report ``on_prefill_done`` (first token seen: actual prefill/TTFT known) and ``on_finished``
   (request done or failed) so the queue model and the prefill regression stay calibrated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from operator import attrgetter
from typing import ClassVar, NamedTuple, Protocol

from radix_global.ops import MatchResult
from radix_global.types import Namespace, PageKey, PoolId, Role, WorkerId

Slot = tuple[WorkerId, int]
"""A routing target: (worker id, data-parallel rank). A worker with ``dp_size == 1`` has rank 0."""


class RouteRequest(NamedTuple):
    """One request to route. ``page_keys`` cover only the full pages of the prompt."""

    request_id: str
    namespace: Namespace
    input_tokens: int
    page_keys: Sequence[PageKey]
    page_size: int
    tenant: str | None = None
    ttft_slo_s: float | None = None  # None: the policy's configured default (or no SLO)
    tbt_slo_s: float | None = None
    output_tokens_hint: int | None = None  # expected output length (max_tokens), for decode KV
    # The canonical keys of the leading pages that are a registered platform prefix, for a salted
    # request (docs/interfaces.md, "Shared platform prefixes across isolated tenants"): in the pool
    # of a worker with pool aliases they are these pages, whatever the salt. Empty: nothing shared.
    shared_keys: Sequence[PageKey] = ()
    # Whether the answer is streamed: only a stream's first token is seen, so only a stream can
    # be a TTFT probe whose outcome is measured (``SloConfig.probes``).
    streams: bool = True


class WorkerState(NamedTuple):
    """One routing slot as the caller sees it now. Engine-reported fields are None when unknown.

    The router-side outstanding work (requests routed and not finished) is NOT here: the cost
    model tracks it from ``on_routed`` / ``on_prefill_done`` / ``on_finished``.
    """

    worker_id: WorkerId
    namespace: Namespace
    dp_rank: int = 0
    dp_size: int = 1
    role: Role = Role.MIXED
    pool_id: PoolId | None = None
    url: str = ""
    accepting: bool = True  # False while draining or unhealthy: never chosen
    running: int | None = None  # engine-reported running requests (this rank)
    waiting: int | None = None  # engine-reported queued requests (this rank)
    waiting_tokens: int | None = None  # engine-reported prompt tokens queued, not yet prefilled
    kv_headroom_tokens: int | None = None  # free KV capacity in tokens (decode selection)
    # What the other routers have in flight there (the shared load view, router/routing/
    # load_view.py; 0 for a router alone)
    peer_requests: int = 0  # routed, not finished
    peer_prefill_tokens: int = 0  # prompt tokens of theirs still to prefill
    peer_decode_tokens: int = 0  # decode KV they reserved
    # its pool backend resolves shared-prefix aliases (docs/interfaces.md,
    # "Shared platform prefixes across isolated tenants")
    pool_aliases: bool = False
    # its pool's persistent disk tier, a holder (docs/interfaces.md,
    # "The persistent disk tier under the pool")
    pool_disk_id: PoolId | None = None
    pool_fetch_min_tokens: int = 0  # its engine loads no shorter pool run (recomputes it)
    # its engine declines new prefetches while this many tokens of them wait (0: no limit)
    pool_prefetch_budget_tokens: int = 0

    @property
    def slot(self) -> Slot:
        return (self.worker_id, self.dp_rank)


class FetchPiece(NamedTuple):
    """Part of a fetch of a store's run (``docs/interfaces.md``, "Mooncake Store as the L3
    pool": "The run a store holds across its segments"): pages ``first_page`` to ``end_page``
    (exclusive) from the segment ``holder``; ``transfer_s``: that segment's whole share of the
    fetch (every piece it sends, one transfer), predicted."""

    holder: PoolId
    first_page: int
    end_page: int
    transfer_s: float


class CandidateEstimate(NamedTuple):
    """The TTFT breakdown for one candidate slot (all times in seconds, lengths in tokens)."""

    worker_id: WorkerId
    dp_rank: int
    local_prefix_tokens: int  # reusable from the slot's own GPU/host cache
    fetch_tokens: int  # to pull from an L3 pool before prefill (0 = recompute)
    fetch_from: PoolId | None
    queue_s: float
    prefill_s: float
    transfer_s: float
    ttft_s: float  # queue_s + transfer_s + prefill_s
    load: int  # outstanding requests (ties are broken by this)
    # a fetch over a store's segments: its pieces, read in parallel (transfer_s: the slowest);
    # fetch_from is then the segment with the most pages. Empty: one holder, fetch_from.
    fetch_pieces: tuple[FetchPiece, ...] = ()


class RejectReason(StrEnum):
    """Why the router refused a request before any engine saw it (429, or 503 for
    ``NO_WORKERS``; the message and the ``decision_<reason>`` counter)."""

    TTFT_SLO = "ttft_slo"  # predicted to miss its TTFT SLO everywhere
    TBT_SLO = "tbt_slo"  # PD: no decode slot would meet its TBT SLO
    DECODE_KV = "decode_kv"  # PD: no decode slot has KV room for it
    NO_WORKERS = "no_workers"  # nothing serves its model (or everything is draining)
    UNSPECIFIED = "rejected"  # a policy that rejected without saying why


class DecisionOutcome(StrEnum):
    """How a decision went, as ``radix_global_decisions_total`` and ``/admin/stats`` count it:
    accepted, else the :class:`RejectReason` (whose values it shares)."""

    ACCEPTED = "accepted"
    TTFT_SLO = RejectReason.TTFT_SLO.value
    TBT_SLO = RejectReason.TBT_SLO.value
    DECODE_KV = RejectReason.DECODE_KV.value
    NO_WORKERS = RejectReason.NO_WORKERS.value
    UNSPECIFIED = RejectReason.UNSPECIFIED.value


class Decision(NamedTuple):
    """A policy's answer: a route (``accepted``) or a rejection with reason and retry hint."""

    request_id: str
    policy: str
    accepted: bool
    worker_id: WorkerId | None = None
    dp_rank: int = 0
    prefix_tokens: int = 0  # tokens the chosen slot will not compute (local + fetched)
    fetch_tokens: int = 0
    fetch_from: PoolId | None = None
    fetch_pieces: tuple[FetchPiece, ...] = ()  # a fetch over a store's segments (as above)
    predicted_ttft_s: float | None = None
    predicted_prefill_s: float | None = None  # the prefill part alone (feeds the queue model)
    predicted_queue_s: float = 0.0
    predicted_transfer_s: float = 0.0
    decode_worker_id: WorkerId | None = None  # PD disaggregation: the paired decode slot
    decode_dp_rank: int = 0
    reason: RejectReason | None = None  # why it was rejected (None: accepted)
    retry_after_s: float | None = None
    candidates: tuple[CandidateEstimate, ...] = ()  # every slot considered (metrics, debugging)
    # the longest prefix any holder had in the index at the decision, whole pages and at most
    # prompt - 1 tokens (None: the policy read no index)
    available_tokens: int | None = None
    # admitted although predicted to miss its TTFT SLO: a sample of the would-be rejections
    # whose outcome measures the false ones (``SloConfig.ttft_probe_every``)
    probe: bool = False

    @property
    def outcome(self) -> DecisionOutcome:
        if self.accepted:
            return DecisionOutcome.ACCEPTED
        return DecisionOutcome(self.reason or RejectReason.UNSPECIFIED)

    @property
    def slot(self) -> Slot:
        if self.worker_id is None:
            raise ValueError(f"rejected decision for {self.request_id} has no slot")
        return (self.worker_id, self.dp_rank)


class IndexView(Protocol):
    """What a policy reads from the global index (``radix_global.index.GlobalIndex`` fits)."""

    def match(self, namespace: Namespace, keys: Sequence[PageKey], now: float) -> MatchResult: ...


class CostView(Protocol):
    """What a policy reads from the cost model (``router.routing.cost.CostModel`` implements it)."""

    def prefill_s(self, worker: WorkerId, input_tokens: int, prefix_tokens: int) -> float: ...

    def queue_s(self, worker: WorkerState, now: float) -> float: ...

    def transfer_s(self, pool: PoolId, worker: WorkerState, tokens: int,
                   now: float | None = None) -> float:
        """Seconds to move ``tokens`` of KV from ``pool`` to ``worker``; with ``now``, after
        what was already planned from that pool's link (a Mooncake segment's)."""
        ...

    def outstanding(self, slot: Slot) -> int: ...

    def idle_queue_s(self, worker: WorkerId) -> float:
        """``queue_s`` of a slot of ``worker`` with nothing in flight there from any router,
        nothing queued on its server and no engine report of load: what only a learned fit
        adds (its drag base). Changes only where :meth:`idle_changes` says."""
        ...

    def idle_changes(self, since: int) -> tuple[int, list[WorkerId] | None]:
        """(the change count now, the workers whose :meth:`idle_queue_s` changed after count
        ``since``, or None when a worker was removed since: read every worker again); a reader
        keeps the count it last saw."""
        ...

    def busy(self) -> tuple[Collection[Slot], Collection[WorkerId]]:
        """The slots with requests of this router in flight, and the workers whose shared
        compute holds prefills of this router's (all their slots queue behind them): every
        other slot's own queue and load are zero."""
        ...

    def prefetch_reserved_tokens(self, slot: Slot, min_tokens: int) -> int:
        """Prompt tokens beyond the local prefix of ``slot``'s requests still before their
        first token, counting those of at least ``min_tokens``."""
        ...


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Read access a policy gets to the rest of the router. ``index`` is None without an index
    (cache-blind policies and the approximate policy do not need it)."""

    index: IndexView | None
    cost: CostView


class RoutingPolicy(ABC):
    """A routing policy. ``choose`` must be side-effect free on the view; policy-private state
    (round-robin cursor, approximate trees) changes only in the ``on_*`` hooks, so a caller that
    rejects or fails to forward a decision leaves the policy as it was."""

    name: ClassVar[str]
    # Whether ``choose`` picks by the cluster's state (load, cache). The dispatch gate needs it:
    # a held request waits for room on the slot it would pick. Where the pick is a turn or a
    # draw that moves only when a request is routed (round_robin, random), held requests would
    # wait for the turn's engine while another has room: the router holds nothing for them.
    places_by_state: ClassVar[bool] = True

    @abstractmethod
    def choose(
        self, req: RouteRequest, workers: Sequence[WorkerState], view: ClusterView, now: float
    ) -> Decision:
        """Pick a slot among ``workers`` for ``req`` (or reject). Never raises for an empty or
        all-draining list: that is ``Decision(accepted=False, reason=RejectReason.NO_WORKERS)``."""

    def on_routed(self, req: RouteRequest, decision: Decision, now: float) -> None:  # noqa: B027
        """The request was forwarded as decided."""

    def on_finished(self, request_id: str, ok: bool, now: float) -> None:  # noqa: B027
        """The request completed (``ok``) or failed/was cancelled."""

    def on_worker_removed(self, worker_id: WorkerId) -> None:  # noqa: B027
        """A worker left the cluster: forget anything kept about it."""

    def on_peer_routed(self, slot: tuple[WorkerId, int], tip: PageKey,  # noqa: B027
                       now: float) -> None:
        """Another router routed a prompt whose last page key is ``tip`` to ``slot`` (the
        shared load view): a policy that remembers where it routed prompts may remember it
        too."""


class PolicyConfigError(ValueError):
    """Unknown policy name or bad policy option."""


def takes_prefills(worker: WorkerState) -> bool:
    """Accepting and not decode-only: a prefill candidate for a request of its namespace."""
    return worker.accepting and worker.role != Role.DECODE


def is_prefill_candidate(req: RouteRequest, worker: WorkerState) -> bool:
    return takes_prefills(worker) and worker.namespace == req.namespace


_SLOT_ORDER = attrgetter("worker_id", "dp_rank")  # ``WorkerState.slot``, without the property


class SlotSet(Sequence[WorkerState], ABC):
    """Every slot, kept between decisions (:class:`router.routing.slot_table.SlotTable`): what a
    caller may pass as ``workers`` in place of a list, so that a decision builds nothing per
    slot. As a sequence: every slot in slot order."""

    @abstractmethod
    def candidates(self, namespace: Namespace) -> Sequence[WorkerState]:
        """The prefill candidates of a request of ``namespace`` (:func:`prefill_candidates`),
        in slot order; read them, do not change them."""

    @abstractmethod
    def get(self, slot: Slot) -> WorkerState | None:
        """``slot``'s state (None: no such slot)."""


def prefill_candidates(req: RouteRequest, workers: Sequence[WorkerState]
                       ) -> Sequence[WorkerState]:
    """Slots that may run ``req``'s prefill (accepting, not decode-only, same namespace), in slot
    order (worker id, dp rank): rotations and tie-breaks then do not depend on the order the
    caller listed the workers in. A :class:`SlotSet` has them ready."""
    if isinstance(workers, SlotSet):
        return workers.candidates(req.namespace)
    return sorted((w for w in workers if is_prefill_candidate(req, w)), key=_SLOT_ORDER)


def has_reported_load(worker: WorkerState) -> bool:
    """Other routers' or the engine's load on the slot: what, beyond this router's own work
    (``CostView.busy``), makes ``queue_s`` and :func:`slot_load` price it above an idle slot."""
    return bool(worker.peer_requests or worker.peer_prefill_tokens or worker.running
                or worker.waiting or worker.waiting_tokens)


def slot_load(worker: WorkerState, view: ClusterView) -> int:
    """Outstanding requests of a slot: the larger of what this router sent there and not yet saw
    finish, and what the engine reports (which also counts other routers' traffic)."""
    engine = (worker.running or 0) + (worker.waiting or 0)
    return max(view.cost.outstanding(worker.slot), engine)


def no_workers(req: RouteRequest, policy: str) -> Decision:
    return Decision(req.request_id, policy, accepted=False, reason=RejectReason.NO_WORKERS)


def route_to(req: RouteRequest, policy: str, worker: WorkerState, view: ClusterView,
             now: float, prefix_tokens: int = 0) -> Decision:
    """An accepted decision for a cache-blind choice, with the cost model's estimate filled in."""
    prefill = view.cost.prefill_s(worker.worker_id, req.input_tokens, prefix_tokens)
    queue = view.cost.queue_s(worker, now)
    return Decision(
        req.request_id, policy, accepted=True, worker_id=worker.worker_id,
        dp_rank=worker.dp_rank, prefix_tokens=prefix_tokens,
        predicted_ttft_s=queue + prefill, predicted_prefill_s=prefill, predicted_queue_s=queue,
    )
