"""Admission accounting (``router/admission_ledger.py``) from known decisions and answers."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from radix_global.types import WorkerId
from router.admission_ledger import AdmissionLedger, ErrorSample
from router.routing.contract import Decision, RejectReason


def accepted(predicted: float, probe: bool = False) -> Decision:
    return Decision("r", "conductor", True, WorkerId("w0"), predicted_ttft_s=predicted,
                    probe=probe)


def rejected(predicted: float | None, reason: RejectReason = RejectReason.TTFT_SLO) -> Decision:
    return Decision("r", "conductor", False, reason=reason, predicted_ttft_s=predicted)


def test_the_error_sample_is_the_cdf_of_the_last_errors():
    sample = ErrorSample(size=4)
    assert sample.at_most(0.0) is None
    for e in (-0.2, 0.1, 0.3, 0.5, 0.7):  # the first falls out
        sample.add(e)
    assert sample.at_most(0.0) == 0 and sample.at_most(0.3) == 0.5 and sample.at_most(1) == 1


def test_acceptance_attainment_probes_and_expected_false_rejections():
    now = [0.0]
    registry = CollectorRegistry()
    ledger = AdmissionLedger(registry, lambda: now[0], lambda: 2)
    slo = 1.0
    ledger.decided("tiny", rejected(1.5), slo)  # before any error: unpriced
    # three answered streams: errors (observed after hold - predicted) -0.4, 0.0, +0.4
    for predicted, observed in ((0.8, 0.4), (0.9, 0.9), (0.7, 1.1)):
        ledger.decided("tiny", accepted(predicted), slo)
        ledger.answered("tiny", accepted(predicted), True, observed + 0.05, 0.05, slo, 0.02, 0.05)
    # a rejection predicted at 1.3: met if the error <= -0.3, one error in three
    ledger.decided("tiny", rejected(1.3), slo)
    ledger.decided("tiny", rejected(None, RejectReason.DECODE_KV), slo)
    # a probe that met the SLO and one that missed it; a failed request books no SLO
    ledger.answered("tiny", accepted(1.2, probe=True), True, 0.9, 0.0, slo, None, 0.05)
    ledger.answered("tiny", accepted(1.4, probe=True), True, 1.6, 0.0, slo, 0.09, 0.05)
    ledger.answered("tiny", accepted(0.5), False, None, 0.0, slo, None, 0.05)
    now[0] = 1800.0  # two engines for half an hour: one engine-hour
    stats = ledger.stats()
    m = stats["models"]["tiny"]
    assert m["accepted"] == 3 and m["rejected"] == {"ttft_slo": 2, "decode_kv": 1}
    assert m["acceptance_rate"] == pytest.approx(3 / 6)
    assert (m["ttft_met"], m["ttft_missed"]) == (3, 2)  # 0.45, 0.95 met; 1.15, 1.6 missed
    assert (m["tbt_met"], m["tbt_missed"]) == (3, 1)
    assert (m["probes"], m["probes_met"]) == (2, 1) and m["false_rejection_share_probes"] == 0.5
    assert m["rejections_unpriced"] == 1
    assert m["false_rejections_expected"] == pytest.approx(1 / 3)
    assert m["false_rejection_share_predicted"] == pytest.approx(1 / 3)
    assert stats["engine_hours"] == pytest.approx(1.0) and m["completed"] == 5
    assert stats["completed_per_engine_hour"] == pytest.approx(5.0)
    assert registry.get_sample_value("radix_global_slo_requests_total",
                                     {"model": "tiny", "slo": "ttft", "outcome": "missed"}) == 2
    assert registry.get_sample_value("radix_global_admission_probes_total",
                                     {"model": "tiny", "outcome": "met"}) == 1
