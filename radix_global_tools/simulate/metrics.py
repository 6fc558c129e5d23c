"""Summaries of one simulated run (pure: records in, numbers out)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from radix_global_tools.simulate.config import Calibration
from radix_global_tools.simulate.records import RequestRecord
from radix_global_tools.simulate.workload import SimRequest, full_page_keys


class RunSummary(NamedTuple):
    requests: int
    accepted: int
    rejected: int
    mean_ttft_s: float
    p50_ttft_s: float
    p90_ttft_s: float
    p99_ttft_s: float
    mean_queue_s: float
    hit_rate: float  # reused prompt tokens (local + fetched) / prompt tokens, accepted requests
    local_hit_rate: float
    prefill_compute_s: float  # summed prefill compute (GPU) time, accepted requests
    fetch_s: float
    slo_attainment: float  # requests with TTFT <= SLO / all requests (rejected count as missed)
    goodput_rps: float  # requests meeting the SLO per second of simulated time
    makespan_s: float
    mean_decision_us: float
    p99_decision_us: float


def _pct(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def summarize(records: Sequence[RequestRecord], ttft_slo_s: float) -> RunSummary:
    acc = [r for r in records if r.accepted and r.ttft_s is not None]
    ttfts = sorted(r.ttft_s for r in acc if r.ttft_s is not None)
    tokens = sum(r.input_tokens for r in acc) or 1
    met = sum(1 for t in ttfts if t <= ttft_slo_s)
    start = min((r.arrival_s for r in records), default=0.0)
    end = max(
        [r.arrival_s + (r.ttft_s or 0.0) for r in records] or [0.0]
    )
    makespan = max(end - start, 1e-9)
    decisions = sorted(r.decision_s * 1e6 for r in records)
    return RunSummary(
        requests=len(records),
        accepted=len(acc),
        rejected=len(records) - len(acc),
        mean_ttft_s=statistics.fmean(ttfts) if ttfts else float("nan"),
        p50_ttft_s=_pct(ttfts, 0.5),
        p90_ttft_s=_pct(ttfts, 0.9),
        p99_ttft_s=_pct(ttfts, 0.99),
        mean_queue_s=statistics.fmean(r.queue_s for r in acc) if acc else float("nan"),
        hit_rate=sum(r.local_tokens + r.fetched_tokens for r in acc) / tokens,
        local_hit_rate=sum(r.local_tokens for r in acc) / tokens,
        prefill_compute_s=sum(r.prefill_s for r in acc),
        fetch_s=sum(r.fetch_s for r in acc),
        slo_attainment=met / len(records) if records else float("nan"),
        goodput_rps=met / makespan,
        makespan_s=makespan,
        mean_decision_us=statistics.fmean(decisions) if decisions else float("nan"),
        p99_decision_us=_pct(decisions, 0.99),
    )


def oracle_reuse(cal: Calibration, requests: Sequence[SimRequest]
                 ) -> Iterator[tuple[SimRequest, int]]:
    """Each request with the tokens it would reuse if every page any earlier request computed
    were cached (unbounded cache, free transfer)."""
    seen: set[int] = set()
    for req in requests:
        keys = full_page_keys(req, cal.page_tokens)
        hit = 0
        while hit < len(keys) and keys[hit] in seen:
            hit += 1
        seen.update(keys)
        yield req, min(hit * cal.page_tokens, max(0, req.input_tokens - 1))


def oracle_mean_ttft_s(cal: Calibration, requests: Sequence[SimRequest]) -> float:
    """A lower bound of every policy's mean TTFT, at any load: no request ever waits, and each
    reuses the longest prefix any earlier request computed (:func:`oracle_reuse`). Dividing it
    by a baseline's mean TTFT bounds the ratio any policy can reach against it."""
    total = sum(cal.prefill_s(req.input_tokens, reused) + cal.first_token_s
                for req, reused in oracle_reuse(cal, requests))
    return total / len(requests) if requests else float("nan")
