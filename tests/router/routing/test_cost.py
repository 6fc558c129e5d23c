"""Prefill regression, queue model, transfer time (router/routing/prefill_model.py, queue_model.py,
cost.py)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from radix_global.types import Namespace, PoolId, WorkerId
from router.routing.contract import Decision, RouteRequest, WorkerState
from router.routing.cost import CostConfig, CostModel
from router.routing.prefill_model import PrefillModel, ProfilePoint, profile_plan
from router.routing.queue_model import PendingPrefill, QueueModel
from router.routing.topology import GBPS, star_cluster

NS = Namespace("m@1")
W = WorkerId("w0")


def true_curve(n: int, p: int) -> float:
    """A known quadratic: 50 ms + 0.2 ms/token + attention 40 ns per (new, earlier) pair."""
    m = n - p
    return 0.05 + 2e-4 * m + 4e-8 * m * (p + m / 2)


def test_profile_plan_covers_cold_and_cached_points_page_aligned() -> None:
    plan = profile_plan(8192, 64)
    assert ProfilePoint(8192, 0) in plan and ProfilePoint(8192, 4096) in plan
    assert all(p.input_tokens % 64 == 0 and p.prefix_tokens % 64 == 0 for p in plan)
    assert len({p.input_tokens for p in plan}) == 4
    with pytest.raises(ValueError):
        profile_plan(64, 64)


def test_regression_learns_a_known_quadratic_and_reports_its_error() -> None:
    model = PrefillModel()  # generic prior, far from the truth
    assert model.mape() is None
    for point in profile_plan(16384, 64):
        model.observe(point.input_tokens, point.prefix_tokens, true_curve(*point))
    rng = random.Random(1)
    for _ in range(40):
        n = rng.randrange(256, 16384)
        p = rng.randrange(0, n // 64) * 64
        model.observe(n, p, true_curve(n, p) * rng.uniform(0.97, 1.03))
    for n, p in [(1000, 0), (16000, 0), (16000, 15000), (30000, 10000)]:
        assert model.predict(n, p) == pytest.approx(true_curve(n, p), rel=0.06)
    err = model.mape()
    assert err is not None and err < 0.5  # includes the early, prior-only predictions
    recent = PrefillModel(error_window=10)
    for _ in range(3):
        for point in profile_plan(16384, 64):
            recent.observe(point.input_tokens, point.prefix_tokens, true_curve(*point))
    assert (recent.mape() or 1.0) < 0.02  # once fitted, the rolling error is small


def test_bad_observations_are_ignored() -> None:
    model = PrefillModel()
    for bad in (0.0, -1.0, math.nan, math.inf):
        model.observe(100, 0, bad)
    assert model.observations == 0 and model.mape() is None


def test_calibrated_curve_reproduces_its_parameters() -> None:
    model = PrefillModel.calibrated(0.05, 2e-4, 4e-8)
    for n, p in [(100, 0), (8000, 4000), (32000, 0)]:
        assert model.predict(n, p) == pytest.approx(true_curve(n, p), rel=1e-9)
    big = PrefillModel.llama3_70b_8xa800()
    assert 0.5 < big.predict(8192, 0) < 2.0  # order of magnitude of the paper's setup
    assert big.predict(8192, 8000) < big.predict(8192, 0) / 10


def pending(at: float, s: float, transfer: float = 0.0) -> PendingPrefill:
    return PendingPrefill(at, s, 1000, 0, transfer)


def test_queue_is_a_fifo_reconstruction_corrected_by_completions() -> None:
    q = QueueModel()
    slot = (W, 0)
    assert q.queue_s(slot, 0.0) == 0.0
    q.add(slot, "a", pending(0.0, 2.0))
    q.add(slot, "b", pending(0.5, 1.0, transfer=0.5))
    assert q.queue_s(slot, 1.0) == pytest.approx(2.5)  # a ends at 2, b at 3.5
    done = q.prefill_done("a", 1.5)  # a finished early
    assert done is not None and done.inferred_s == pytest.approx(1.5)
    assert q.queue_s(slot, 1.5) == pytest.approx(1.5)  # b now starts at 1.5
    assert q.queue_s(slot, 5.0) == 0.0  # b overran: never negative
    assert q.outstanding(slot) == 2 and q.pending_prefills(slot) == 1
    assert q.finished("b") == slot and q.finished("b") is None
    assert q.prefill_done("zzz", 1.0) is None
    q.forget_worker(W)
    assert q.outstanding(slot) == 0


def test_workers_sharing_compute_queue_as_one_fifo_server() -> None:
    q = QueueModel()
    a, b, c = (WorkerId("a"), 0), (WorkerId("b"), 0), (WorkerId("c"), 0)
    q.share_compute(a[0], "cpu@host")
    q.share_compute(b[0], "cpu@host")
    q.add(a, "r1", pending(0.0, 2.0))
    assert q.queue_s(b, 0.0) == pytest.approx(2.0)  # b's cores are busy with a's prefill
    assert q.queue_s(c, 0.0) == 0.0  # c computes on its own
    q.add(b, "r2", pending(0.0, 1.0))
    assert q.queue_s(a, 0.0) == pytest.approx(3.0) and q.pending_prefills(a) == 2
    assert q.outstanding(a) == 1 and q.outstanding(b) == 1  # load stays per worker
    assert q.prefill_done("r1", 1.0) is not None
    assert q.queue_s(b, 1.0) == pytest.approx(1.0)
    q.forget_worker(b[0])  # b's requests leave the shared queue with it
    assert q.queue_s(a, 1.0) == 0.0 and q.outstanding(b) == 0
    q.share_compute(a[0], None)
    q.add(a, "r3", pending(1.0, 1.0))
    assert q.queue_s(a, 1.0) == pytest.approx(1.0)


def ws(**kw: object) -> WorkerState:
    return WorkerState(W, NS, pool_id=PoolId("pool"), **kw)  # type: ignore[arg-type]


def test_engine_reported_waiting_tokens_are_blended_in() -> None:
    cost = CostModel(CostConfig(engine_queue_weight=0.5),
                     prefill_prior=lambda: PrefillModel.calibrated(0.05, 2e-4, 4e-8))
    assert cost.queue_s(ws(), 0.0) == 0.0
    # queued prompts are separate sequences: their fixed and per-token cost, no attention
    # across them (as one 10k-token prompt it would be 4 s more)
    engine = 0.05 + 2e-4 * 10_000
    assert true_curve(10_000, 0) > engine + 1.0
    assert cost.queue_s(ws(waiting_tokens=10_000), 0.0) == pytest.approx(0.5 * engine)
    assert cost.queue_s(ws(waiting_tokens=0), 0.0) == 0.0


def test_other_routers_queued_prefill_counts_and_the_engine_corrects_only_upwards() -> None:
    cost = CostModel(CostConfig(engine_queue_weight=0.5),
                     prefill_prior=lambda: PrefillModel.calibrated(0.05, 2e-4, 4e-8))
    peers = 0.05 + 2e-4 * 4_000  # their queued prompts, priced as separate ones
    assert cost.queue_s(ws(peer_prefill_tokens=4_000), 0.0) == pytest.approx(peers)
    # an engine reporting less than the routers' sum does not shorten it (what is on its way
    # is not there yet); one reporting more moves it half way (engine_queue_weight)
    assert cost.queue_s(ws(peer_prefill_tokens=4_000, waiting_tokens=1_000), 0.0) \
        == pytest.approx(peers)
    engine = 0.05 + 2e-4 * 10_000
    assert cost.queue_s(ws(peer_prefill_tokens=4_000, waiting_tokens=10_000), 0.0) \
        == pytest.approx(peers + 0.5 * (engine - peers))


def test_routed_and_finished_requests_move_the_queue_and_train_the_model() -> None:
    cost = CostModel()
    req = RouteRequest("r", NS, 2000, [], 16)
    dec = Decision("r", "x", True, W, 0, prefix_tokens=0, predicted_prefill_s=3.0,
                   predicted_ttft_s=3.0)
    cost.on_routed(req, dec, 10.0)
    assert cost.queue_s(ws(), 10.0) == pytest.approx(3.0)
    cost.on_prefill_done("r", 12.0)  # inferred: 2 s of prefill
    assert cost.queue_s(ws(), 12.0) == 0.0
    assert cost.prefill_model(W).observations == 1
    assert cost.outstanding((W, 0)) == 1
    cost.on_finished("r", 13.0)
    assert cost.outstanding((W, 0)) == 0


def test_transfer_time_uses_the_topology_bottleneck_or_the_default() -> None:
    topo = star_cluster({"h0": [PoolId("pool")], "h1": [W]}, nic_Bps=100 * GBPS)
    cost = CostModel(CostConfig(kv_bytes_per_token=1000, default_bandwidth_Bps=1e6), topo)
    assert cost.transfer_s(PoolId("pool"), ws(), 1000) == pytest.approx(1e6 / (100 * GBPS))
    assert cost.transfer_s(PoolId("elsewhere"), ws(), 1000) == pytest.approx(1.0)
    assert cost.transfer_s(PoolId("pool"), ws(), 0) == 0.0
    for size in (1, 2, 3, 4):  # 10 ms a transfer + 1 GB/s, slower than the NIC
        topo.observe_transfer(PoolId("pool"), W, nbytes=size * 10**9, seconds=0.01 + size)
    assert cost.bandwidth_Bps(PoolId("pool"), W) == pytest.approx(1e9)
    assert cost.transfer_s(PoolId("pool"), ws(), 1000) == pytest.approx(0.01 + 1e6 / 1e9)


def test_a_segment_on_another_host_is_priced_at_the_remote_bandwidth() -> None:
    """Segments of one store: the worker's own host at the default (memory), another host at
    the remote bandwidth; a reported holder bandwidth and a topology come first."""
    cost = CostModel(CostConfig(kv_bytes_per_token=1000, default_bandwidth_Bps=1e6,
                                remote_segment_bandwidth_Bps=1e5))
    own, here, there = (PoolId(f"mc@10.0.0.{h}:{p}") for h, p in ((1, 30000), (1, 30001),
                                                                   (2, 30000)))
    worker = ws()._replace(pool_id=own)
    assert cost.transfer_s(here, worker, 1000) == pytest.approx(1.0)  # same host
    assert cost.transfer_s(there, worker, 1000) == pytest.approx(10.0)  # over the link
    assert cost.transfer_s(there, ws(), 1000) == pytest.approx(1.0)  # own pool not a segment
    cost.set_holder_bandwidth(there, 4e6)
    assert cost.transfer_s(there, worker, 1000) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        CostConfig(remote_segment_bandwidth_Bps=0)


def test_a_fetch_from_a_segment_waits_for_what_was_planned_from_it() -> None:
    """docs/interfaces.md, "Where hosts are": a sender's backlog. A fetch planned from a
    segment holds its link until its predicted end; the next fetch from it waits for that; the
    segment's own worker, a read of one's own segment and a pool that is not a segment book
    and wait for nothing."""
    cost = CostModel(CostConfig(kv_bytes_per_token=1000, default_bandwidth_Bps=1e6,
                                remote_segment_bandwidth_Bps=1e6))
    seg_a, seg_b = PoolId("mc@10.0.0.1:1"), PoolId("mc@10.0.0.2:1")
    reader = ws()._replace(pool_id=seg_b)
    owner = ws()._replace(worker_id=WorkerId("wa"), pool_id=seg_a)
    assert cost.transfer_s(seg_a, reader, 1000, 0.0) == pytest.approx(1.0)
    req = RouteRequest("r", NS, 3000, [], 16)
    fetch = Decision("r", "x", True, W, 0, prefix_tokens=2000, fetch_tokens=2000,
                     fetch_from=seg_a, predicted_prefill_s=0.1, predicted_transfer_s=2.0)
    cost.on_routed(req, fetch, 0.0, seg_b)
    assert cost.transfer_s(seg_a, reader, 1000, 0.5) == pytest.approx(2.5)  # 1.5 s still ahead
    assert cost.transfer_s(seg_a, reader, 1000) == pytest.approx(1.0)  # no time: no wait
    assert cost.transfer_s(seg_a, owner, 1000, 0.5) == pytest.approx(1.0)  # its own: no link
    assert cost.transfer_s(seg_b, reader, 1000, 0.5) == pytest.approx(1.0)
    assert cost.transfer_s(seg_a, reader, 1000, 2.0) == pytest.approx(1.0)  # sent by now
    # not booked: a read of the worker's own segment, and a pool that is not a segment
    cost.on_routed(req._replace(request_id="s"), fetch._replace(request_id="s"), 3.0, seg_a)
    cost.on_routed(req._replace(request_id="t"), fetch._replace(
        request_id="t", fetch_from=PoolId("shm")), 3.0, seg_b)
    assert cost.transfer_s(seg_a, reader, 1000, 3.0) == pytest.approx(1.0)
    assert len(cost.sending) == 1


def test_a_workers_measured_load_path_caps_its_transfer_speed() -> None:
    """The engine's load path (``WorkerInfo.pool_load_Bps``) is the bottleneck when it is
    slower than the link, from any pool, once the worker's prefill is profiled; it is
    forgotten with the worker."""
    topo = star_cluster({"h0": [PoolId("pool")], "h1": [W]}, nic_Bps=100 * GBPS)
    cost = CostModel(CostConfig(kv_bytes_per_token=1000, default_bandwidth_Bps=1e6), topo)
    cost.set_load_bandwidth(W, 2.5e5)
    # on the prior prefill curve the link alone prices it: a measured load is weighed only
    # against a measured (profiled) prefill
    assert cost.transfer_s(PoolId("elsewhere"), ws(), 1000) == pytest.approx(1.0)
    cost.set_prefill_model(W, cost.prefill_model(W), learn_inferred=True)  # still the prior
    assert cost.transfer_s(PoolId("elsewhere"), ws(), 1000) == pytest.approx(1.0)
    cost.set_prefill_model(W, PrefillModel())
    assert cost.transfer_s(PoolId("pool"), ws(), 1000) == pytest.approx(4.0)
    assert cost.transfer_s(PoolId("elsewhere"), ws(), 1000) == pytest.approx(4.0)
    cost.set_load_bandwidth(W, 1e12)  # faster than the link: the link prices it
    assert cost.transfer_s(PoolId("elsewhere"), ws(), 1000) == pytest.approx(1.0)
    cost.set_load_bandwidth(W, 2.5e5)
    cost.on_worker_removed(W)
    assert cost.transfer_s(PoolId("elsewhere"), ws(), 1000) == pytest.approx(1.0)
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError):
            cost.set_load_bandwidth(W, bad)


def test_learn_from_inferred_prefill_is_one_switch_with_the_live_default() -> None:
    """A worker on the prior learns from FIFO-inferred times; one whose model was installed (a
    profile) does not unless ``learn_from_inferred_prefill`` (default False, as the live router
    ran: the CostConfig switch was True but RouterConfig's False applied to profiles)."""
    def observations(cost: CostModel, install: bool, **kw: bool) -> int:
        if install:
            cost.set_prefill_model(W, PrefillModel(), **kw)
        req = RouteRequest("r", NS, 2000, [], 16)
        cost.on_routed(req, Decision("r", "x", True, W, 0, predicted_prefill_s=3.0), 10.0)
        cost.on_prefill_done("r", 12.0)  # inferred, not measured
        return cost.prefill_model(W).observations

    assert observations(CostModel(), install=False) == 1
    assert observations(CostModel(), install=True) == 0
    assert observations(CostModel(), install=True, learn_inferred=True) == 1
    assert observations(CostModel(CostConfig(learn_from_inferred_prefill=True)), install=True) == 1


def test_kv_bytes_per_token_per_namespace() -> None:
    cost = CostModel(CostConfig(kv_bytes_per_token=1000))
    cost.set_kv_bytes_per_token(NS, 10)
    assert cost.kv_bytes_per_token(NS) == 10
    assert cost.kv_bytes_per_token(Namespace("other@1")) == 1000
    with pytest.raises(ValueError):
        cost.set_kv_bytes_per_token(NS, 0)


def _first_tokens(cost: CostModel, worker: WorkerId, residual: Callable[[int], float],
                  n: int, finish: bool, t0: float = 0.0) -> float:
    """``n`` requests routed to ``worker`` one after another, each predicted at 0.1 s of prefill,
    whose first token comes ``residual(requests the slot had)`` later than predicted;
    ``finish``: each ends at once (else they stay, decoding). Returns the time after the last."""
    t = t0
    for i in range(n):
        rid = f"{worker}-{t0}-{i}"
        had = cost.outstanding((worker, 0))
        cost.on_routed(RouteRequest(rid, NS, 1000, [], 16),
                       Decision(rid, "x", True, worker, 0, predicted_prefill_s=0.1), t)
        cost.on_prefill_done(rid, t + 0.1 + residual(had))
        if finish:
            cost.on_finished(rid, t + 0.5)
        t += 1.0
    return t


def test_the_drag_of_a_slots_requests_is_learned_from_measured_first_tokens() -> None:
    """Each request the worker has delays a first token by 0.2 s beyond the FIFO + prefill
    prediction, and the engine adds 0.3 s: the queue a new request sees there is the learned
    line, and only once enough was seen; ``drag_half_life = 0`` turns it off."""
    for half_life, expect in ((64.0, True), (0.0, False)):
        cost = CostModel(CostConfig(drag_half_life=half_life))
        t = _first_tokens(cost, W, lambda k: 0.3 + 0.2 * k, 6, finish=False)
        assert cost.outstanding((W, 0)) == 6
        assert cost.drag_s((W, 0)) == 0.0  # 6 < the 8 observations it needs
        _first_tokens(cost, W, lambda k: 0.3 + 0.2 * k, 6, finish=False, t0=t)
        assert cost.outstanding((W, 0)) == 12
        if expect:
            assert cost.drag_s((W, 0)) == pytest.approx(0.3 + 0.2 * 12, rel=1e-6)
            assert cost.queue_s(ws(), 100.0) == pytest.approx(0.3 + 0.2 * 12, rel=1e-6)
            assert cost.stats()[W]["drag"]["per_request_s"] == pytest.approx(0.2)
        else:
            assert cost.drag_s((W, 0)) == 0.0 and cost.queue_s(ws(), 100.0) == 0.0
    with pytest.raises(ValueError):
        CostConfig(drag_half_life=-1.0)


def test_the_fifo_wait_is_not_counted_as_drag_and_a_queued_request_counts_for_the_next() -> None:
    """A request queued behind another's prefill waits what the queue model predicted: that
    wait is not drag. The one queued ahead counts among the slot's requests for the next one
    (it is decoding by the time the next one's prefill runs)."""
    cost = CostModel()
    t = _first_tokens(cost, W, lambda k: 0.0, 8, finish=True)  # no residual: no drag
    for rid in ("a", "b"):
        cost.on_routed(RouteRequest(rid, NS, 1000, [], 16),
                       Decision(rid, "x", True, W, 0, predicted_prefill_s=1.0), t)
    assert cost.queue.queue_s((W, 0), t) == pytest.approx(2.0)
    cost.on_prefill_done("a", t + 1.0)
    cost.on_prefill_done("b", t + 2.0)  # exactly its predicted wait of 1 s + 1 s of prefill
    assert cost.drag_s((W, 0)) == pytest.approx(0.0, abs=1e-9)
    cost2 = CostModel()
    t = _first_tokens(cost2, W, lambda k: 0.5 * k, 8, finish=True)  # k always 0: the base only
    for rid in ("a", "b"):
        cost2.on_routed(RouteRequest(rid, NS, 1000, [], 16),
                        Decision(rid, "x", True, W, 0, predicted_prefill_s=1.0), t)
    cost2.on_prefill_done("a", t + 1.0)
    cost2.on_prefill_done("b", t + 2.5)  # 0.5 s late, routed while "a" was queued
    _first_tokens(cost2, W, lambda k: 0.5 * k, 8, finish=False, t0=t + 3.0)
    assert cost2.stats()[W]["drag"]["per_request_s"] == pytest.approx(0.5, rel=1e-6)
