"""Admission accounting: how many requests were accepted, how many of those met their SLOs, and
how many of the refused would have met theirs (``docs/interfaces.md``, "What the cache is worth,
live").

False rejections are estimated two ways, side by side:

- **probes**: one in ``ttft_probe_every`` would-be TTFT rejections is admitted
  (``SloConfig.probes``); the share of probes that met the SLO estimates the share of
  rejections that were false. Unbiased, at the price of the probes' own late answers.
- **from the prediction error**: each TTFT rejection adds P(predicted + error <= SLO), the error
  drawn from the last :data:`ERROR_SAMPLE` measured errors (observed - predicted TTFT) of
  accepted streams. Costs nothing; as good as the sample is like the rejected requests' errors.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from router.metrics import Children
from router.routing.contract import Decision, RejectReason

ERROR_SAMPLE = 1024


class ErrorSample:
    """The last ``size`` signed TTFT prediction errors; :meth:`at_most` is their CDF."""

    def __init__(self, size: int = ERROR_SAMPLE) -> None:
        self._recent: deque[float] = deque(maxlen=size)
        self._sorted: list[float] | None = None

    def __len__(self) -> int:
        return len(self._recent)

    def add(self, error_s: float) -> None:
        self._recent.append(error_s)
        self._sorted = None

    def at_most(self, x: float) -> float | None:
        """The share of errors <= ``x`` (None: no error measured yet)."""
        if not self._recent:
            return None
        if self._sorted is None:
            self._sorted = sorted(self._recent)
        return bisect.bisect_right(self._sorted, x) / len(self._sorted)


@dataclass
class ModelAdmission:
    """A model's admission sums since the router started (``/admin/stats`` ``admission``)."""

    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # by reason
    completed: int = 0
    ttft_met: int = 0
    ttft_missed: int = 0
    tbt_met: int = 0
    tbt_missed: int = 0
    probes: int = 0  # answered probes (a stream with a TTFT SLO)
    probes_met: int = 0
    false_rejections_expected: float = 0.0  # from the prediction error
    rejections_unpriced: int = 0  # TTFT rejections before any error was measured

    def report(self) -> dict[str, Any]:
        out = asdict(self)
        rejected = sum(self.rejected.values())
        ttft_rejected = self.rejected.get(RejectReason.TTFT_SLO.value, 0)
        out["acceptance_rate"] = _share(self.accepted, self.accepted + rejected)
        out["ttft_attainment"] = _share(self.ttft_met, self.ttft_met + self.ttft_missed)
        out["tbt_attainment"] = _share(self.tbt_met, self.tbt_met + self.tbt_missed)
        out["false_rejection_share_probes"] = _share(self.probes_met, self.probes)
        priced = ttft_rejected - self.rejections_unpriced
        out["false_rejection_share_predicted"] = _share(self.false_rejections_expected, priced)
        return out


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


class AdmissionLedger:
    """Books each decision and each answer; ``workers()``: how many engines serve now (their
    time, integrated, is the engine-hours that completed requests are divided by)."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float],
                 workers: Callable[[], int]) -> None:
        self._clock, self._workers = clock, workers
        self._models: dict[str, ModelAdmission] = {}
        self.errors = ErrorSample()
        self._engine_s = 0.0
        self._last = clock()
        self._child = Children()
        self.slo = Counter("radix_global_slo_requests", "Answered requests by SLO and whether "
                           "they met it", ["model", "slo", "outcome"], registry=registry)
        self.probes = Counter("radix_global_admission_probes", "Would-be TTFT rejections "
                              "admitted as probes, by whether they met the SLO",
                              ["model", "outcome"], registry=registry)
        self.expected = Counter("radix_global_false_rejections_expected", "TTFT rejections "
                                "that would have met the SLO, expected from the prediction "
                                "error", ["model"], registry=registry)

    def _model(self, model: str) -> ModelAdmission:
        self._tick()
        return self._models.setdefault(model, ModelAdmission())

    def _tick(self) -> None:
        now = self._clock()
        self._engine_s += self._workers() * max(0.0, now - self._last)
        self._last = now

    def decided(self, model: str, decision: Decision, ttft_slo_s: float | None) -> None:
        """A decision the router answered by (accepted, or refused with its reason)."""
        m = self._model(model)
        if decision.accepted:
            m.accepted += 1
            return
        reason = (decision.reason or RejectReason.UNSPECIFIED).value
        m.rejected[reason] = m.rejected.get(reason, 0) + 1
        predicted = decision.predicted_ttft_s
        if decision.reason is not RejectReason.TTFT_SLO or predicted is None \
                or ttft_slo_s is None:
            return
        p = self.errors.at_most(ttft_slo_s - predicted)
        if p is None:
            m.rejections_unpriced += 1
        else:
            m.false_rejections_expected += p
            self._child(self.expected, model).inc(p)

    def answered(self, model: str, decision: Decision, ok: bool, ttft_s: float | None,
                 held_s: float, ttft_slo_s: float | None, tbt_s: float | None,
                 tbt_slo_s: float | None) -> None:
        """An accepted request's end. ``ttft_s``: its first token after arrival (a stream;
        None for a whole answer), ``held_s`` of it at the dispatch gate; ``tbt_s``: its mean
        time between output tokens (None: unknown, or one token)."""
        m = self._model(model)
        m.completed += ok
        if not ok:
            return
        if ttft_s is not None and decision.predicted_ttft_s is not None:
            self.errors.add(ttft_s - held_s - decision.predicted_ttft_s)
        if ttft_s is not None and ttft_slo_s is not None:
            met = ttft_s <= ttft_slo_s
            m.ttft_met += met
            m.ttft_missed += not met
            self._child(self.slo, model, "ttft", "met" if met else "missed").inc()
            if decision.probe:
                m.probes += 1
                m.probes_met += met
                self._child(self.probes, model, "met" if met else "missed").inc()
        if tbt_s is not None and tbt_slo_s is not None:
            met = tbt_s <= tbt_slo_s
            m.tbt_met += met
            m.tbt_missed += not met
            self._child(self.slo, model, "tbt", "met" if met else "missed").inc()

    def stats(self) -> dict[str, Any]:
        self._tick()
        completed = sum(m.completed for m in self._models.values())
        hours = self._engine_s / 3600
        return {"engine_hours": hours,
                "completed_per_engine_hour": completed / hours if hours else None,
                "prediction_errors": len(self.errors),
                "models": {name: m.report() for name, m in self._models.items()}}
