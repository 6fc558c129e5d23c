"""How much the requests a slot already has delay a new request's first token, learned online.

The queue model (the router-side FIFO of prefills) and the prefill curve price a request as if
its engine did nothing but the prefills queued ahead of it. A real engine runs the new prefill
between the decode steps of every request it has, and pays costs an idle engine's profile does
not show (on a CPU engine each request in the batch takes a share of every step; on a GPU a
mixed batch is slower). Measured on the cache-pressure benchmark's agents workload
(``docs/benchmarks-archive.md``, run 9): the first token came 0.26-0.44 s after the prediction with
nothing else on the engine, and 0.15-0.3 s later for each request in flight there, so the busier
engine looked as free as the idle one.

:class:`DragModel` fits the residual ``measured TTFT - (FIFO wait + transfer + prefill)`` as
``base + per_request * k``, ``k`` the requests routed to the slot and not finished when the
request was routed (queued or decoding: one queued ahead is decoding by the time this one's
prefill runs), by least squares with exponential forgetting (a worker's load path and batch
change; recent requests weigh most). ``per_request`` is never negative (noise must not make a
busy slot look faster), and the predicted drag never below 0 (the profile prices the rest).
Pure: the caller feeds observations.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class DragFit(NamedTuple):
    base_s: float  # the residual with nothing else on the slot
    per_request_s: float  # added per request the slot has
    observations: int


class DragModel:
    """``half_life``: observations after which one weighs half; ``min_observations``: no drag
    before this many (a few first requests, each paying one-time costs, say little);
    ``max_residual_s``: one residual counts at most this much (a stalled request is an outlier,
    not a trend)."""

    def __init__(self, half_life: float = 64.0, min_observations: int = 8,
                 max_residual_s: float = 10.0) -> None:
        if not half_life > 0 or min_observations < 2 or not max_residual_s > 0:
            raise ValueError("need half_life > 0, min_observations >= 2, max_residual_s > 0")
        self._decay = 0.5 ** (1.0 / half_life)
        self.min_observations = min_observations
        self.max_residual_s = max_residual_s
        # weighted sums: 1, k, k^2, y, k*y
        self._w = self._k = self._kk = self._y = self._ky = 0.0
        self.observations = 0

    def observe(self, outstanding: int, residual_s: float) -> None:
        """A request routed while its slot had ``outstanding`` others took ``residual_s`` more
        than predicted to its first token. A non-finite residual is ignored."""
        if outstanding < 0:
            raise ValueError(f"outstanding must be >= 0, got {outstanding}")
        if not math.isfinite(residual_s):
            return
        y = max(-self.max_residual_s, min(self.max_residual_s, residual_s))
        k, d = outstanding, self._decay
        self._w = d * self._w + 1.0
        self._k = d * self._k + k
        self._kk = d * self._kk + k * k
        self._y = d * self._y + y
        self._ky = d * self._ky + k * y
        self.observations += 1

    def fit(self) -> DragFit:
        if self.observations == 0:
            return DragFit(0.0, 0.0, 0)
        w, k, kk, y, ky = self._w, self._k, self._kk, self._y, self._ky
        spread = w * kk - k * k  # weighted variance of k, x w^2: 0 when every k was the same
        slope = (w * ky - k * y) / spread if spread > 1e-9 * w * w else 0.0
        slope = max(0.0, slope)
        return DragFit((y - slope * k) / w, slope, self.observations)

    def predict(self, outstanding: int) -> float:
        """Seconds to add to the predicted TTFT of a request routed to a slot that has
        ``outstanding`` requests."""
        if self.observations < self.min_observations:
            return 0.0
        fit = self.fit()
        return max(0.0, fit.base_s + fit.per_request_s * outstanding)
