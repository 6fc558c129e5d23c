"""The simulator's decode side: PD through the router's decode selection, co-located stalls."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from radix_global.types import PageKey
from radix_global_tools.plan.capacity_curve import capacity_curve
from radix_global_tools.simulate.config import Calibration
from radix_global_tools.simulate.decode import DecodeProfile
from radix_global_tools.simulate.engine import Simulation
from radix_global_tools.simulate.experiments import FIG5_SETUPS, run_one
from radix_global_tools.simulate.metrics import summarize
from radix_global_tools.simulate.records import RequestRecord
from radix_global_tools.simulate.workload import SimRequest, read_trace

DATA = Path(__file__).resolve().parents[3] / "benchmarks" / "data"
CAL = replace(Calibration(), decode=DecodeProfile(
    step_fixed_s=0.015, step_per_request_s=1e-4, step_per_context_token_s=3e-8,
    kv_tokens_per_instance=1_000_000))


@pytest.fixture(scope="module")
def trace():  # type: ignore[no-untyped-def]
    return read_trace(DATA / "conversation_sample.jsonl")


def run(trace, instances: int, cal: Calibration = CAL, **spec: Any  # type: ignore[no-untyped-def]
        ) -> tuple[list[RequestRecord], Simulation]:
    _, s = run_one(cal, trace, instances, FIG5_SETUPS["global_cache_aware"],
                   cal.local_tokens_per_instance, **spec)
    return s.records, s


def mean_tbt(records: list[RequestRecord]) -> float:
    return statistics.fmean(r.tbt_s for r in records if r.tbt_s is not None)


def test_pd_every_request_decodes_on_a_decode_instance(trace) -> None:  # type: ignore[no-untyped-def]
    records, s = run(trace, 4, decode_instances=2)
    assert all(r.accepted and r.tbt_s is not None for r in records)
    # a lone request's step is at least the fixed part
    assert min(r.tbt_s or 1.0 for r in records) >= CAL.decode.step_fixed_s
    assert {w for w in s.decoders} == {"d0", "d1"}
    assert s.driver.decode.reserved() == {}, "every reservation released at the last token"
    assert s.driver.in_flight() == 0


def test_fewer_decode_instances_batch_more(trace) -> None:  # type: ignore[no-untyped-def]
    burst = [r._replace(arrival_s=i * 0.01) for i, r in enumerate(trace[:60])]
    one, _ = run(burst, 4, decode_instances=1)
    four, _ = run(burst, 4, decode_instances=4)
    assert mean_tbt(one) > mean_tbt(four)


def test_decode_kv_full_means_rejection(trace) -> None:  # type: ignore[no-untyped-def]
    small = replace(CAL, decode=replace(CAL.decode, kv_tokens_per_instance=20_000))
    burst = [r._replace(arrival_s=i * 0.001) for i, r in enumerate(trace[:40])]
    records, _ = run(burst, 4, small, decode_instances=1)
    assert any(r.reason == "decode_kv" for r in records)


def test_colocated_prefills_stall_the_batch(trace) -> None:  # type: ignore[no-untyped-def]
    """Co-located decode is slower than PD on the same instances' worth of decode: every
    prefill of the instance stalls its batch. Negative control: with the stall gone (decode
    on instances of its own, one per prefill instance) TBT drops."""
    burst = [r._replace(arrival_s=i * 0.2) for i, r in enumerate(trace[:150])]
    colo, _ = run(burst, 4, colocated=True)
    pd, _ = run(burst, 4, decode_instances=4)
    assert mean_tbt(colo) > 1.5 * mean_tbt(pd)
    # the prefill waits for the step in progress: TTFT is no shorter co-located
    assert summarize(colo, 30).mean_ttft_s >= summarize(pd, 30).mean_ttft_s


@pytest.mark.parametrize("kv_tokens", [1_500, 100_000])
def test_colocated_prefill_waits_for_free_kv(kv_tokens: int) -> None:
    """Co-located, a prompt is prefilled only into free KV: while ``a`` decodes and holds 1,050
    of 1,500 tokens, ``b`` (1,000 more) waits for ``a``'s last token. The control: with room
    for both, ``b`` starts as soon as ``a``'s prefill is done."""
    cal = replace(CAL, decode=replace(CAL.decode, kv_tokens_per_instance=kv_tokens))
    pages = tuple(PageKey(i) for i in range(1000 // cal.page_tokens + 1))
    a = SimRequest("a", 0.0, 1000, 51, pages)
    b = SimRequest("b", 0.01, 1000, 51, tuple(PageKey(-1 - i) for i in range(len(pages))))
    records, _ = run([a, b], 1, cal, colocated=True)
    ra, rb = sorted(records, key=lambda r: r.request_id)
    a_decoding_s = 50 * cal.decode.step_fixed_s
    if kv_tokens < 2 * 1050:
        assert rb.queue_s >= (ra.ttft_s or 0) + a_decoding_s - b.arrival_s
    else:
        assert rb.queue_s < (ra.ttft_s or 0) + cal.decode.step_fixed_s


def test_without_a_decode_side_nothing_changes(trace) -> None:  # type: ignore[no-untyped-def]
    records, _ = run(trace, 4)
    assert all(r.tbt_s is None for r in records)


def test_the_reuse_curve_reaches_the_simulated_hit_rate() -> None:
    """At an unbounded pool the one-pass curve and the simulator agree (issue 43: within 0.01;
    the whole trace's numbers are in docs/benchmarks.md)."""
    trace = read_trace(DATA / "conversation_multiturn_sample.jsonl")
    every_page = len({k for r in trace for k in r.page_keys}) * CAL.page_tokens
    records, _ = run(trace, 4, pool_tokens=every_page)
    simulated = summarize(records, 30).hit_rate
    assert abs(capacity_curve(trace, CAL.page_tokens).max_hit_rate - simulated) <= 0.01
