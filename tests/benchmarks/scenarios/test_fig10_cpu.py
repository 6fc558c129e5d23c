"""The pure parts of the Fig. 10 analogue (``benchmarks/scenarios/fig10_cpu.py``) and of the engine
probe's curve fit (``benchmarks/scenarios/engine_probe.py``)."""

from __future__ import annotations

import pytest

from benchmarks.scenarios.engine_probe import fit, prompts
from benchmarks.scenarios.fig10_cpu import GLOBAL, LOCAL, real_hit_rates, sim_requests, simulate
from benchmarks.scenarios.pressure_bench import Point
from radix_global.keys import page_keys
from radix_global.trace import TraceRequest
from radix_global_tools.replay.plan import PlannedRequest
from radix_global_tools.simulate.config import Calibration

PS = 16


def point(prompts_: list[list[int]], gap_s: float = 10.0) -> Point:
    trace = TraceRequest(0, 0, 0, [])
    plan = [PlannedRequest(i, i * gap_s, ids, 4, trace) for i, ids in enumerate(prompts_)]
    return Point("conversations", "2 req / 20 s", plan, gap_s * len(plan), PS)


def test_the_fit_recovers_a_known_curve() -> None:
    rows = [{"tokens": n, "ttft_s": 0.05 + 1e-3 * n + 2e-7 * n * n} for n in (256, 512, 1024, 2048)]
    got = fit(rows)
    assert got["fixed_s"] == pytest.approx(0.05, abs=1e-6)
    assert got["linear_s_per_token"] == pytest.approx(1e-3, rel=1e-6)
    assert got["quadratic_s_per_token2"] == pytest.approx(2e-7, rel=1e-6)


def test_probe_prompts_are_distinct_and_sized() -> None:
    ps = prompts([32, 64], 2, seed=1)
    assert [len(p) for p in ps] == [32, 32, 64, 64] and len({tuple(p) for p in ps}) == 4


def test_sim_requests_carry_the_plans_pages_and_arrivals() -> None:
    ids = list(range(100, 164))
    (req,) = sim_requests(point([ids]), PS)
    assert req.arrival_s == 0.0 and req.input_tokens == 64 and req.output_tokens == 4
    assert req.page_keys == tuple(page_keys(ids, PS))


def test_the_pool_lets_a_second_instance_reuse_what_the_first_computed() -> None:
    """Two requests sharing a long prefix, the first instance busy when the second arrives:
    with a pool the second is fetched elsewhere or reused; the simulated hit rate is higher."""
    shared = list(range(1000, 1000 + 1024))
    cal = Calibration(kv_bytes_per_token=6144, page_tokens=PS, fixed_s=0.05,
                      linear_s_per_token=1e-3, quadratic_s_per_token2=0.0,
                      bandwidth_bytes_per_s=1e9, fetch_latency_s=0.01, first_token_s=0.03,
                      local_tokens_per_instance=8192, pool_tokens_per_instance=40960,
                      ttft_slo_s=5.0)
    sim = simulate(point([shared + [1] * 16, shared + [2] * 16], gap_s=5.0), cal, 2)
    assert sim["global_cache_aware"] >= sim["local_cache_aware"] > 0


def test_real_hit_rates_take_the_matching_runs_only() -> None:
    p = point([[1] * 32])
    runs = [
        {"contender": LOCAL, "workload": "conversations", "load": p.load,
         "reuse": {"delivered_fraction": 0.4}},
        {"contender": GLOBAL, "workload": "conversations", "load": "other",
         "reuse": {"delivered_fraction": 0.9}},
        {"contender": GLOBAL, "workload": "conversations", "load": p.load, "skipped": "x"},
        {"contender": GLOBAL, "workload": "conversations", "load": p.load, "repeat": 2,
         "reuse": {"delivered_fraction": 0.7}},  # a later repeat: (1) ran in the first only
    ]
    assert real_hit_rates(runs, p) == {LOCAL: 0.4, GLOBAL: None}
