"""Decode worker selection for prefill/decode disaggregation, with KV reservations.

A decode slot qualifies when its free KV (engine-reported headroom minus what this router already
reserved) holds the request's prompt and expected output, and its predicted time between tokens
(a linear model of batch size) meets the TBT SLO. Among those, the lowest predicted TBT wins,
then the most free KV. The reservation is made when the request is routed (before prefill, so
concurrent requests cannot all count on the same free memory) and released when it finishes or
fails. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, NamedTuple

from radix_global.options import opt
from radix_global.types import Role, WorkerId
from router.routing.contract import RejectReason, RouteRequest, Slot, WorkerState


@dataclass(frozen=True)
class TbtModel:
    """Time between tokens of a decode batch: ``base_s + per_request_s * batch``."""

    base_s: float = 0.02
    per_request_s: float = 0.0005

    def predict(self, batch: int) -> float:
        return self.base_s + self.per_request_s * max(0, batch)


@dataclass(frozen=True)
class DecodeConfig:
    """Decode selection: time between tokens = base + per_request x batch.

    ``RouterConfig.decode``, options ``decode_*`` (router/routing/decode_select.py)."""

    tbt_base_s: Annotated[float, opt(
        "predicted time between tokens of an empty decode batch", ge=0)] = TbtModel.base_s
    tbt_per_request_s: Annotated[float, opt(
        "... plus this per request in the batch", ge=0)] = TbtModel.per_request_s
    default_output_tokens: Annotated[int, opt(
        "output tokens reserved for a request without a hint", ge=0)] = 256

    @property
    def tbt(self) -> TbtModel:
        return TbtModel(self.tbt_base_s, self.tbt_per_request_s)


class DecodeChoice(NamedTuple):
    accepted: bool
    worker_id: WorkerId | None = None
    dp_rank: int = 0
    predicted_tbt_s: float | None = None
    reserve_tokens: int = 0
    reason: RejectReason | None = None  # TBT_SLO, DECODE_KV or NO_WORKERS when refused


class _Reservation(NamedTuple):
    slot: Slot
    tokens: int


class DecodeSelector:
    def __init__(self, config: DecodeConfig | None = None) -> None:
        self.config = config or DecodeConfig()
        self._reservations: dict[str, _Reservation] = {}
        self._reserved_tokens: dict[Slot, int] = {}
        self._reserved_count: dict[Slot, int] = {}
        # KV tokens per rank of a decode worker, for slots whose headroom the engine does not
        # report (the HTTP router learns it once from the worker's /server_info).
        self.capacity: dict[WorkerId, int] = {}

    def needed_tokens(self, req: RouteRequest) -> int:
        output = req.output_tokens_hint
        return req.input_tokens + (output if output is not None else
                                   self.config.default_output_tokens)

    def batch_size(self, worker: WorkerState) -> int:
        """Requests decoding there: engine-reported, or what this router reserved if larger."""
        engine = (worker.running or 0) + (worker.waiting or 0)
        return max(engine, self._reserved_count.get(worker.slot, 0))

    def free_tokens(self, worker: WorkerState) -> int | None:
        headroom = worker.kv_headroom_tokens
        if headroom is None:
            headroom = self.capacity.get(worker.worker_id)
        if headroom is None:
            return None
        return headroom - self._reserved_tokens.get(worker.slot, 0) - worker.peer_decode_tokens

    def choose(
        self, req: RouteRequest, workers: Sequence[WorkerState], tbt_slo_s: float | None
    ) -> DecodeChoice:
        decode = [w for w in workers
                  if w.accepting and w.role == Role.DECODE and w.namespace == req.namespace]
        if not decode:
            return DecodeChoice(False, reason=RejectReason.NO_WORKERS)
        need = self.needed_tokens(req)
        fits = [w for w in decode if _fits(self.free_tokens(w), need)]
        if not fits:
            return DecodeChoice(False, reason=RejectReason.DECODE_KV)
        # The new request joins the batch, hence + 1.
        scored = [(self.config.tbt.predict(self.batch_size(w) + 1), w) for w in fits]
        ok = [(t, w) for t, w in scored if tbt_slo_s is None or t <= tbt_slo_s]
        if not ok:
            return DecodeChoice(False, reason=RejectReason.TBT_SLO,
                                predicted_tbt_s=min(t for t, _ in scored))
        tbt, best = min(ok, key=lambda tw: (tw[0], -(self.free_tokens(tw[1]) or 0), tw[1].slot))
        return DecodeChoice(True, best.worker_id, best.dp_rank, tbt, need)

    def reserve(self, request_id: str, slot: Slot, tokens: int) -> None:
        """Hold ``tokens`` of KV on ``slot`` for ``request_id`` (replacing an earlier hold)."""
        self.release(request_id)
        self._reservations[request_id] = _Reservation(slot, tokens)
        self._reserved_tokens[slot] = self._reserved_tokens.get(slot, 0) + tokens
        self._reserved_count[slot] = self._reserved_count.get(slot, 0) + 1

    def release(self, request_id: str) -> bool:
        """Give back the hold of ``request_id``; False if it had none (already released)."""
        held = self._reservations.pop(request_id, None)
        if held is None:
            return False
        self._reserved_tokens[held.slot] -= held.tokens
        self._reserved_count[held.slot] -= 1
        if self._reserved_count[held.slot] == 0:
            del self._reserved_count[held.slot], self._reserved_tokens[held.slot]
        return True

    def reserved_tokens(self, slot: Slot) -> int:
        return self._reserved_tokens.get(slot, 0)

    def reserved(self) -> dict[Slot, int]:
        """Decode KV this router reserved, per slot (for the shared load view)."""
        return dict(self._reserved_tokens)

    def forget_worker(self, worker_id: WorkerId) -> None:
        for request_id in [r for r, h in self._reservations.items() if h.slot[0] == worker_id]:
            self.release(request_id)


def _fits(free: int | None, need: int) -> bool:
    return free is None or free >= need  # unknown headroom: trust the engine to queue
