"""Per-request results of a replay and their summary (pure; no I/O).

Definitions (the summary's JSON keys)
- ``ttft_s``: send -> first streamed chunk carrying an output token. Only ``ok`` requests count.
- ``tbt_s`` samples: per streamed chunk after the first, the gap since the previous chunk divided
  by the number of tokens it added (one sample per token), pooled over ok requests.
- A request meets the SLO when it is ok, its TTFT <= ``ttft_slo_s`` and its own p90 TBT <=
  ``tbt_slo_s``. ``slo_attainment`` = meeting / all requests sent (rejected and failed miss it).
- ``goodput_rps`` = SLO-meeting requests / wall time from the first send to the last answer.
- ``rejected``: answered 429/503 (admission control or overload); ``failed``: anything else wrong.
- ``prefix_tokens_reused``: sum of the engines' ``cached_tokens`` usage reports;
  ``pool_tokens_loaded``: the part the engines report as loaded from L3 storage
  (``cached_tokens_details.storage``); ``bytes_moved`` = pool tokens x KV bytes per token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class SloTargets:
    ttft_s: float = 2.0
    tbt_s: float = 0.25


@dataclass
class RequestResult:
    index: int
    status: str  # ok | rejected | failed
    scheduled_s: float  # planned send time after the start
    sent_s: float  # actual send time after the start
    prompt_tokens: int
    output_tokens_wanted: int
    http_status: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    output_tokens: int = 0
    tbt_s: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    device_cached_tokens: int | None = None
    host_cached_tokens: int | None = None
    pool_tokens_loaded: int = 0
    worker: str | None = None  # where our router sent it (x-radix-worker); peers do not say
    router_prefix_tokens: int | None = None  # the prefix our router expected there
    router_fetch_tokens: int | None = None  # of it, what our router planned to fetch from L3
    router_available_tokens: int | None = None  # held anywhere, in our router's index
    router_queue_s: float | None = None  # the wait our router predicted there
    router_ttft_s: float | None = None  # the TTFT our router predicted there
    router_hold_s: float | None = None  # how long our router's dispatch gate held it
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def meets_slo(r: RequestResult, slo: SloTargets) -> bool:
    if r.status != "ok" or r.ttft_s is None or r.ttft_s > slo.ttft_s:
        return False
    p90 = percentile(r.tbt_s, 90)
    return p90 is None or p90 <= slo.tbt_s


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(results: Sequence[RequestResult], slo: SloTargets, wall_s: float,
              kv_bytes_per_token: int | None = None) -> dict[str, Any]:
    ok = [r for r in results if r.status == "ok"]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tbts = [g for r in ok for g in r.tbt_s]
    meeting = sum(1 for r in results if meets_slo(r, slo))
    pool_tokens = sum(r.pool_tokens_loaded for r in results)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    reused = sum(r.cached_tokens for r in ok)
    lags = [r.sent_s - r.scheduled_s for r in results]
    return {
        "requests": len(results),
        "ok": len(ok),
        "rejected": sum(1 for r in results if r.status == "rejected"),
        "failed": sum(1 for r in results if r.status == "failed"),
        "ttft_mean_s": _mean(ttfts),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "ttft_p99_s": percentile(ttfts, 99),
        "tbt_p90_s": percentile(tbts, 90),
        "latency_mean_s": _mean([r.latency_s for r in ok if r.latency_s is not None]),
        "slo": asdict(slo),
        "slo_attainment": meeting / len(results) if results else None,
        "goodput_rps": meeting / wall_s if wall_s > 0 else None,
        "wall_s": wall_s,
        "prompt_tokens": prompt_tokens,
        "output_tokens": sum(r.output_tokens for r in ok),
        "prefix_tokens_reused": reused,
        "prefix_reuse_fraction": reused / prompt_tokens if prompt_tokens else None,
        "pool_tokens_loaded": pool_tokens,
        "kv_bytes_per_token": kv_bytes_per_token,
        "bytes_moved": pool_tokens * kv_bytes_per_token if kv_bytes_per_token else None,
        "send_lag_max_s": max(lags) if lags else None,
    }
