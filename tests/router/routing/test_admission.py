"""router/routing/admission.py and the driver's decode-side admission."""

from __future__ import annotations

import pytest

from radix_global.types import Namespace, Role, WorkerId
from router.routing.admission import SloConfig, check_ttft
from router.routing.contract import CandidateEstimate, RouteRequest, WorkerState
from router.routing.cost import CostModel
from router.routing.decode_select import DecodeConfig, DecodeSelector
from router.routing.driver import PolicyDriver
from router.routing.policies import get_policy

NS = Namespace("m@1")


def estimate(ttft: float) -> CandidateEstimate:
    return CandidateEstimate(WorkerId("w"), 0, 0, 0, None, ttft, 0.0, 0.0, ttft, 0)


def test_a_request_slo_may_only_tighten_the_operators() -> None:
    req = RouteRequest("r", NS, 10, [], 16)
    assert check_ttft(req, estimate(100.0), SloConfig()) is None
    assert check_ttft(req, estimate(3.0), SloConfig(ttft_slo_s=2.0)) == pytest.approx(1.0)
    # a looser SLO of the client's does not switch the operator's admission off for it
    assert check_ttft(req._replace(ttft_slo_s=1e9), estimate(3.0), SloConfig(ttft_slo_s=2.0)) \
        == pytest.approx(1.0)
    assert check_ttft(req._replace(ttft_slo_s=1.0), estimate(1.5), SloConfig(ttft_slo_s=2.0)) \
        == pytest.approx(0.5)  # a stricter one applies
    assert check_ttft(req._replace(ttft_slo_s=1.0), estimate(1.5), SloConfig()) \
        == pytest.approx(0.5)  # and one where the operator set none
    assert SloConfig(tbt_slo_s=0.1).tbt_for(req._replace(tbt_slo_s=0.05)) == 0.05
    assert SloConfig(tbt_slo_s=0.1).tbt_for(req._replace(tbt_slo_s=5.0)) == 0.1


def test_headroom_keeps_part_of_the_ttft_slo_back() -> None:
    req = RouteRequest("r", NS, 10, [], 16)
    slo = SloConfig(ttft_slo_s=2.0, ttft_headroom=0.1)  # admit up to 1.8 s predicted
    assert check_ttft(req, estimate(1.8), slo) is None
    assert check_ttft(req, estimate(1.9), slo) == pytest.approx(0.1)
    assert check_ttft(req._replace(ttft_slo_s=4.0), estimate(3.7), slo) is not None  # 3.6
    assert check_ttft(req, estimate(1.9), SloConfig(ttft_slo_s=2.0)) is None
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError):
            SloConfig(ttft_headroom=bad)


def test_retry_after_is_the_excess_clamped() -> None:
    slo = SloConfig(min_retry_after_s=1.0, max_retry_after_s=20.0)
    assert slo.retry_after_s(0.2) == 1.0
    assert slo.retry_after_s(7.5) == 7.5
    assert slo.retry_after_s(500.0) == 20.0
    with pytest.raises(ValueError):
        SloConfig(ttft_slo_s=0.0)
    with pytest.raises(ValueError):
        SloConfig(min_retry_after_s=5.0, max_retry_after_s=1.0)


def pd_cluster(headroom: int = 10_000, running: int = 0) -> list[WorkerState]:
    return [
        WorkerState(WorkerId("p0"), NS, role=Role.PREFILL),
        WorkerState(WorkerId("d0"), NS, role=Role.DECODE, kv_headroom_tokens=headroom,
                    running=running),
        WorkerState(WorkerId("d1"), NS, role=Role.DECODE, kv_headroom_tokens=headroom // 2,
                    running=running),
    ]


def test_pd_pairs_a_decode_worker_reserves_and_releases() -> None:
    drv = PolicyDriver(get_policy("conductor"), CostModel())
    ws = pd_cluster()
    req = RouteRequest("r0", NS, 1000, [], 16, output_tokens_hint=500)
    dec = drv.route(req, ws, 0.0)
    assert dec.accepted and dec.worker_id == "p0" and dec.decode_worker_id == "d0"
    assert drv.decode.reserved_tokens((WorkerId("d0"), 0)) == 1500
    # d0 now has 8500 free vs d1's 5000 but one more request in its batch: lower TBT wins
    dec2 = drv.route(req._replace(request_id="r1"), ws, 0.0)
    assert dec2.decode_worker_id == "d1"
    drv.finished("r0", False, 1.0)
    drv.finished("r0", False, 1.0)  # idempotent
    assert drv.decode.reserved_tokens((WorkerId("d0"), 0)) == 0


def test_no_decode_capacity_or_tbt_rejects_without_recording() -> None:
    drv = PolicyDriver(get_policy("round_robin"), CostModel())
    req = RouteRequest("r0", NS, 1000, [], 16, output_tokens_hint=500)
    dec = drv.route(req, pd_cluster(headroom=1000), 0.0)
    assert not dec.accepted and dec.reason == "decode_kv" and dec.retry_after_s is not None
    assert drv.in_flight() == 0
    slow = DecodeSelector(DecodeConfig(tbt_base_s=0.01, tbt_per_request_s=0.01))
    drv = PolicyDriver(get_policy("round_robin"), CostModel(), decode=slow)
    dec = drv.route(req._replace(tbt_slo_s=0.05), pd_cluster(running=10), 0.0)
    assert not dec.accepted and dec.reason == "tbt_slo"
    assert drv.in_flight() == 0 and drv.cost.outstanding((WorkerId("p0"), 0)) == 0
    ok = drv.route(req._replace(tbt_slo_s=0.05), pd_cluster(running=2), 0.0)
    assert ok.accepted  # 0.01 + 0.01 * 3 <= 0.05


def test_mixed_workers_need_no_decode_pairing() -> None:
    drv = PolicyDriver(get_policy("least_load"), CostModel())
    dec = drv.route(RouteRequest("r", NS, 10, [], 16), [WorkerState(WorkerId("m"), NS)], 0.0)
    assert dec.accepted and dec.decode_worker_id is None


def test_pd_tbt_slo_of_the_router_config_applies_to_native_pd_too() -> None:
    from router.config import RouterConfig
    from router.state import RouterState

    # pd_mode native
    state = RouterState(RouterConfig.from_options(policy="round_robin", pd_tbt_slo_s=0.05))
    state.routing.decode = DecodeSelector(DecodeConfig(tbt_base_s=0.01, tbt_per_request_s=0.01))
    req = RouteRequest("r0", NS, 1000, [], 16, output_tokens_hint=500)
    dec = state.routing.route(req, pd_cluster(running=10), 0.0)
    assert not dec.accepted and dec.reason == "tbt_slo"
    assert RouterState(RouterConfig()).routing.slo.tbt_slo_s is None  # 0 = no decode SLO


def test_every_reject_reason_is_a_decision_outcome():
    """``radix_global_decisions_total`` counts each decision under its outcome: every reason a
    policy may give has one, and a rejection without a reason is counted too, never lost."""
    from router.routing.contract import Decision, DecisionOutcome, RejectReason

    assert {o.value for o in DecisionOutcome} == {r.value for r in RejectReason} | {"accepted"}
    for reason in RejectReason:
        assert Decision("r", "p", accepted=False, reason=reason).outcome == reason.value
    assert Decision("r", "p", accepted=False).outcome is DecisionOutcome.UNSPECIFIED
    assert Decision("r", "p", accepted=True).outcome is DecisionOutcome.ACCEPTED
