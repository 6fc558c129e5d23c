"""The simulator engine driving the real index, cost model and policies on tiny traces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from radix_global.types import PageKey
from radix_global_tools.simulate.config import Calibration
from radix_global_tools.simulate.engine import NAMESPACE, ClusterSpec, Simulation
from radix_global_tools.simulate.experiments import FIG5_SETUPS, make_cost, make_policy, run_one
from radix_global_tools.simulate.shared_tiers import DISK_ID, POOL_ID
from radix_global_tools.simulate.workload import SimRequest, full_page_keys, read_trace, scale_load
from router.routing.policies import get_policy

SAMPLE = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "conversation_sample.jsonl"
CAL = Calibration()


def req(rid: str, t: float, ids: list[int], tokens: int | None = None) -> SimRequest:
    n = tokens if tokens is not None else 512 * len(ids)
    return SimRequest(rid, t, n, 10, tuple(PageKey(i) for i in ids))


def sim(instances: int, policy: str = "least_load", local_tokens: int = 512 * 100,
        pool: bool = False, cal: Calibration = CAL, prefill_batch: int = 1) -> Simulation:
    spec = ClusterSpec(instances, cal, local_tokens, pool, prefill_batch=prefill_batch)
    return Simulation(spec, get_policy(policy), make_cost(cal))


def test_completion_is_handled_before_an_arrival_at_the_same_instant() -> None:
    done_at = CAL.prefill_s(2048, 0)
    s = sim(1)
    records = s.run([req("a", 0.0, [1, 2, 3, 4]), req("b", done_at, [1, 2, 3, 4])])
    by_id = {r.request_id: r for r in records}
    # b arrives exactly when a's prefill completes: a's pages must already be cached
    assert by_id["b"].queue_s == 0.0
    assert by_id["b"].local_tokens == 2047  # all but the last token (its logits are needed)


def test_fifo_queueing_and_ttft_breakdown() -> None:
    s = sim(1)
    records = s.run([req("a", 0.0, [1, 2]), req("b", 0.1, [7, 8])])
    a, b = sorted(records, key=lambda r: r.request_id)
    assert a.queue_s == 0.0
    assert b.queue_s == pytest.approx(a.prefill_s - 0.1)
    for r in (a, b):
        assert r.ttft_s == pytest.approx(r.queue_s + r.fetch_s + r.prefill_s + CAL.first_token_s)


def test_requests_waiting_together_are_prefilled_as_one_batch() -> None:
    trace = [req("a", 0.0, [1, 2]), req("b", 0.1, [3, 4]), req("c", 0.1, [5, 6]),
             req("d", 0.1, [7, 8])]
    one = {r.request_id: r for r in sim(1).run(trace)}
    two = {r.request_id: r for r in sim(1, prefill_batch=2).run(trace)}
    assert len({round(one[k].ttft_s or 0, 9) for k in "bcd"}) == 3  # one at a time
    # b and c waited together: one batch, one first-token time, the fixed cost paid once
    assert two["b"].queue_s == two["c"].queue_s == pytest.approx(one["b"].queue_s)
    assert two["b"].ttft_s == pytest.approx(two["c"].ttft_s or 0)
    assert two["b"].ttft_s == pytest.approx((one["c"].ttft_s or 0) - CAL.fixed_s)
    assert two["d"].queue_s == pytest.approx(two["b"].queue_s + 2 * one["b"].prefill_s
                                             - CAL.fixed_s)


def test_lru_eviction_removes_pages_from_the_index() -> None:
    s = sim(1, local_tokens=512 * 4)
    first = [1, 2, 3]
    s.run([req("a", 0.0, first), req("b", 10.0, [7, 8, 9])])
    match = s.index.match(NAMESPACE, [PageKey(i) for i in first], 20.0)
    held = match.matched.get((s.instances[0].worker_id, 0))
    # 6 pages into a 4-page cache: a's two deepest pages were evicted, its root kept
    assert held is not None and held.host == 1
    assert s.index.stats().pages_removed == 2
    assert s.instances[0].cache.prefix_pages([PageKey(i) for i in first]) == 1


@pytest.mark.parametrize("label", list(FIG5_SETUPS))
def test_sample_trace_end_to_end_index_mirrors_the_caches(label: str) -> None:
    trace = scale_load(read_trace(SAMPLE, limit=120), 4.0)
    setup = FIG5_SETUPS[label]
    cal = replace(CAL, local_tokens_per_instance=512 * 300, pool_tokens_per_instance=512 * 300)
    spec = ClusterSpec(4, cal, cal.local_tokens_per_instance, setup.with_pool)
    s = Simulation(spec, make_policy(setup, cal, cal.local_tokens_per_instance), make_cost(cal))
    records = s.run(trace)
    assert len(records) == len(trace) and all(r.accepted for r in records)
    assert s.index_refusals == {}
    assert sum(inst.cache.evicted_pages for inst in s.instances) > 0  # evictions did happen
    # the index agrees with every simulated cache on every prompt (evictions included)
    for r in trace:
        keys = full_page_keys(r, cal.page_tokens)
        match = s.index.match(NAMESPACE, keys, 1e6)
        for inst in s.instances:
            got = match.matched.get((inst.worker_id, 0))
            assert (got.host if got else 0) == inst.cache.prefix_pages(keys)
        if s.shared is not None:
            got = match.matched.get((POOL_ID, 0))
            assert (got.pool if got else 0) == s.shared.pool.prefix_pages(keys)


@pytest.mark.parametrize("disk_tokens", [0, 512 * 100])
def test_the_disk_tier_serves_what_the_pool_evicted(disk_tokens: int) -> None:
    """A conversation's history is evicted from a 4-page pool by two other prompts; its next
    turn is fetched from the disk tier under the pool (at the disk's price), and the index
    mirrors the disk. The control: without a disk tier the same turn is recomputed."""
    cal = replace(CAL, disk_read_bytes_per_s=CAL.bandwidth_bytes_per_s / 10,
                  linear_s_per_token=1e-3)  # slow compute: any fetch beats recomputing
    spec = ClusterSpec(1, cal, 512, True, pool_tokens=512 * 4, disk_tokens=disk_tokens)
    s = Simulation(spec, make_policy(FIG5_SETUPS["global_cache_aware"], cal, 512),
                   make_cost(cal))
    history = [1, 2, 3, 4]
    trace = [req("a", 0.0, history), req("b", 10.0, [11, 12, 13, 14]),
             req("c", 20.0, [21, 22, 23, 24]), req("a2", 30.0, [*history, 5])]
    turn = {r.request_id: r for r in s.run(trace)}["a2"]
    if disk_tokens:  # at the disk's price (ten times the pool's): read from the disk
        assert turn.fetched_tokens == 512 * 4
        assert turn.fetch_s == pytest.approx(cal.disk_fetch_s(512 * 4))
        held = s.index.match(NAMESPACE, [PageKey(i) for i in history], 1e6).matched
        assert held[(DISK_ID, 0)].pool == 4
    else:
        assert turn.fetched_tokens == 0


def test_global_pool_fetches_and_local_setups_never_do() -> None:
    trace = scale_load(read_trace(SAMPLE), 2.0)
    glob, _ = run_one(CAL, trace, 8, FIG5_SETUPS["global_cache_aware"], 512 * 200)
    local, _ = run_one(CAL, trace, 8, FIG5_SETUPS["local_cache_aware"], 512 * 200)
    assert glob.hit_rate > glob.local_hit_rate  # some reuse came from the pool
    assert local.hit_rate == local.local_hit_rate
    assert glob.hit_rate > local.hit_rate


def test_ttft_slo_admission_rejects_under_overload() -> None:
    trace = scale_load(read_trace(SAMPLE), 20.0)
    setup = FIG5_SETUPS["global_cache_aware"]
    without, _ = run_one(CAL, trace, 2, setup, CAL.local_tokens_per_instance)
    with_slo, _ = run_one(CAL, trace, 2, setup, CAL.local_tokens_per_instance, ttft_slo_s=10.0)
    assert without.rejected == 0 and with_slo.rejected > 0
    assert with_slo.p99_ttft_s < without.p99_ttft_s


def test_oracle_bound_is_exact_on_a_toy_trace_and_no_policy_beats_it() -> None:
    from radix_global_tools.simulate.metrics import oracle_mean_ttft_s

    toy = [req("a", 0.0, [1, 2, 3]), req("b", 0.1, [1, 2, 4]), req("c", 0.2, [9])]
    expect = (CAL.prefill_s(1536, 0) + CAL.prefill_s(1536, 1024) + CAL.prefill_s(512, 0)) / 3
    assert oracle_mean_ttft_s(CAL, toy) == pytest.approx(expect + CAL.first_token_s)
    trace = scale_load(read_trace(SAMPLE, limit=120), 4.0)
    bound = oracle_mean_ttft_s(CAL, trace)
    for label, setup in FIG5_SETUPS.items():
        summary, _ = run_one(CAL, trace, 4, setup, CAL.local_tokens_per_instance)
        assert summary.mean_ttft_s >= bound * (1 - 1e-9), label


def test_the_false_rejection_estimate_tracks_the_truth_and_beats_the_trivial_ones(monkeypatch
                                                                                   ) -> None:
    """The admission ledger's estimate from the prediction error, on the overload run where the
    truth is known (each rejection priced as it would have gone): with a cautious headroom most
    rejections are false, and the estimate is within a tenth of the better trivial estimate's
    error (none false / all false); with no headroom almost none are, and it says so."""
    from radix_global_tools.simulate.experiments import false_rejections
    from router.admission_ledger import AdmissionLedger

    trace = scale_load(read_trace(SAMPLE), 20.0)
    setup = FIG5_SETUPS["global_cache_aware"]

    def run(headroom: float) -> dict:
        _, s = run_one(CAL, trace, 2, setup, CAL.local_tokens_per_instance, ttft_slo_s=10.0,
                       ttft_headroom=headroom)
        return false_rejections(s)

    cautious = run(0.3)
    assert cautious["rejections"] > 100 and 0 < cautious["truth"] < cautious["rejections"]
    trivial = min(cautious["error_trivial_none"], cautious["error_trivial_all"])
    assert cautious["error"] <= 0.1 * trivial, cautious
    exact = run(0.0)
    assert exact["truth"] <= 0.05 * exact["rejections"] and exact["error"] <= 2, exact
    # negative control: a ledger that never learns the prediction error cannot estimate
    monkeypatch.setattr(AdmissionLedger, "answered", lambda *a, **k: None)
    blind = run(0.3)
    assert blind["error"] > 0.1 * min(blind["error_trivial_none"], blind["error_trivial_all"])
