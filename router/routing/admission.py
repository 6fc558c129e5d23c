"""SLO admission: reject at once (HTTP 429 + Retry-After) what cannot meet its SLO.

A request's own SLO (``RouteRequest.ttft_slo_s`` / ``tbt_slo_s``) may only tighten the operator's:
the smaller of the two applies, so no client can switch admission off for itself by asking for
a loose SLO; ``None`` everywhere means no admission on that dimension. ``ttft_headroom`` keeps a
fraction of the TTFT SLO back for what the cost model does not see (the HTTP hops, the first
decode step, streaming, the model's own error): a request is admitted when its predicted TTFT is
at most ``(1 - ttft_headroom) x SLO``. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.routing.contract import CandidateEstimate, Decision, RouteRequest

TTFT_SLO = "ttft_slo"
TBT_SLO = "tbt_slo"
DECODE_KV = "decode_kv"
NO_WORKERS = "no_workers"


@dataclass(frozen=True)
class SloConfig:
    """The router's one SLO (``RouterConfig.slo_config()``), shared by the conductor's TTFT
    admission and the driver's decode admission; the defaults here are the router's."""

    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None
    ttft_headroom: float = 0.0
    min_retry_after_s: float = 1.0
    max_retry_after_s: float = 60.0

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
    reason: str,
    retry_after_s: float | None,
    candidates: Sequence[CandidateEstimate] = (),
) -> Decision:
    return Decision(
        req.request_id, policy, accepted=False, reason=reason, retry_after_s=retry_after_s,
        candidates=tuple(candidates),
    )
