"""SLO admission: reject at once (HTTP 429 + Retry-After) what cannot meet its SLO.

A request's own SLO (``RouteRequest.ttft_slo_s`` / ``tbt_slo_s``) may only tighten the operator's:
the smaller of the two applies, so no client can switch admission off for itself by asking for
a loose SLO; ``None`` everywhere means no admission on that dimension. ``ttft_headroom`` keeps a
fraction of the TTFT SLO back for what the cost model does not see (the HTTP hops, the first
decode step, streaming, the model's own error): a request is admitted when its predicted TTFT is
at most ``(1 - ttft_headroom) x SLO``. Pure.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from radix_global.options import opt
from router.routing.contract import CandidateEstimate, Decision, RejectReason, RouteRequest


@dataclass(frozen=True)
class SloConfig:
    """Admission: 429 + Retry-After for what is predicted to miss the SLO.

    The router's one SLO (``RouterConfig.slo``), shared by the conductor's TTFT admission and
    the driver's decode admission; the defaults here are the router's. None: no SLO (a 0 in a
    file, the environment or a flag means the same: ``RouterConfig.from_options`` reads it as
    None)."""

    ttft_slo_s: Annotated[float | None, opt(
        "TTFT SLO: 429 for what is predicted to miss it; 0 or unset = none; a request's own "
        "ttft_slo_s may only tighten it", gt=0)] = None
    tbt_slo_s: Annotated[float | None, opt(
        "decode TBT SLO; 0 or unset = none", gt=0, name="pd_tbt_slo_s")] = None
    ttft_headroom: Annotated[float, opt(
        "fraction of the TTFT SLO kept back for what the cost model does not see",
        ge=0, lt=1)] = 0.0
    ttft_probe_every: Annotated[int, opt(
        "admit about one in this many requests TTFT admission would reject, as probes whose "
        "outcome estimates the false rejections; 0 = none", ge=0)] = 0
    min_retry_after_s: Annotated[float, opt("smallest Retry-After of a 429", ge=0)] = 1.0
    max_retry_after_s: Annotated[float, opt("largest Retry-After of a 429", ge=0)] = 60.0

    def __post_init__(self) -> None:
        for name in ("ttft_slo_s", "tbt_slo_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None")
        if not 0.0 <= self.ttft_headroom < 1.0:
            raise ValueError("ttft_headroom must be in [0, 1)")
        if not 0 <= self.min_retry_after_s <= self.max_retry_after_s:
            raise ValueError("need 0 <= min_retry_after_s <= max_retry_after_s")

    def ttft_for(self, req: RouteRequest) -> float | None:
        return _tighter(req.ttft_slo_s, self.ttft_slo_s)

    def tbt_for(self, req: RouteRequest) -> float | None:
        return _tighter(req.tbt_slo_s, self.tbt_slo_s)

    def probes(self, req: RouteRequest) -> bool:
        """Whether ``req``, predicted to miss its TTFT SLO, is admitted as a probe: one in
        ``ttft_probe_every`` by a hash of its id (random ids: an unbiased sample; the same answer
        when it is priced again after a hold), and only a stream (a whole answer's first token
        is never seen: it would be served late and measure nothing)."""
        every = self.ttft_probe_every
        return every > 0 and req.streams and zlib.crc32(req.request_id.encode()) % every == 0

    def retry_after_s(self, excess_s: float) -> float:
        """How long to wait before retrying: the predicted excess over the SLO is queued work
        that has to drain first; clamped to the configured range."""
        return min(self.max_retry_after_s, max(self.min_retry_after_s, excess_s))


def _tighter(client: float | None, operator: float | None) -> float | None:
    """The client's SLO where it is stricter than the operator's, else the operator's."""
    if client is None or operator is None:
        return operator if client is None else client
    return min(client, operator)


def check_ttft(req: RouteRequest, best: CandidateEstimate, slo: SloConfig) -> float | None:
    """None when ``best`` meets the TTFT SLO (or there is none); else the excess in seconds."""
    return ttft_excess(req, best.ttft_s, slo)


def ttft_excess(req: RouteRequest, ttft_s: float, slo: SloConfig) -> float | None:
    """None when a predicted TTFT of ``ttft_s`` meets ``req``'s TTFT SLO (or there is none);
    else the excess in seconds."""
    limit = slo.ttft_for(req)
    if limit is None:
        return None
    limit *= 1.0 - slo.ttft_headroom
    if ttft_s <= limit:
        return None
    return ttft_s - limit


def reject(
    req: RouteRequest,
    policy: str,
    reason: RejectReason,
    retry_after_s: float | None,
    candidates: Sequence[CandidateEstimate] = (),
    predicted_ttft_s: float | None = None,
) -> Decision:
    """A rejection; ``predicted_ttft_s``: the best TTFT predicted, for a TTFT SLO rejection."""
    return Decision(
        req.request_id, policy, accepted=False, reason=reason, retry_after_s=retry_after_s,
        candidates=tuple(candidates), predicted_ttft_s=predicted_ttft_s,
    )
