"""Prefill time as a function of (input length n, reused prefix p), learned online.

The new tokens ``m = n - p`` pay a per-token cost (weights, MLP) and attend to every earlier token
(attention grows with ``m * p + m^2 / 2``), so the model is linear in the features
``[1, m, m*p, m^2]`` (lengths in thousands of tokens to keep the numbers well conditioned).
It is refitted on a bounded window of recent observations by weighted least squares on relative
error (a 0.1 s prefill matters as much as a 10 s one), regularised towards a prior curve so that
directions the data does not cover (e.g. ``m*p`` before any cache hit was observed) keep the prior.
Pure: no clock, no I/O; the caller feeds observations.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

_K = 1000.0  # lengths enter the features in thousands of tokens
MIN_PREDICTION_S = 1e-5


class ProfilePoint(NamedTuple):
    """One bootstrap measurement to take: a prompt of ``input_tokens`` whose first
    ``prefix_tokens`` are already cached on the worker (send that prefix once beforehand)."""

    input_tokens: int
    prefix_tokens: int


def features(input_tokens: int, prefix_tokens: int) -> np.ndarray:
    p = max(0, min(prefix_tokens, input_tokens)) / _K
    m = max(0, input_tokens - prefix_tokens) / _K
    return np.array([1.0, m, m * p, m * m])


def profile_plan(max_input_tokens: int, page_size: int, sizes: int = 4) -> list[ProfilePoint]:
    """The (n, p) points to measure when a worker registers: ``sizes`` input lengths up to
    ``max_input_tokens`` (halving), each cold (p = 0) and with half of it cached (page-aligned),
    enough to identify every coefficient of the model."""
    if max_input_tokens < 2 * page_size or page_size < 1:
        raise ValueError("max_input_tokens must cover at least two pages")
    points: list[ProfilePoint] = []
    n = max_input_tokens
    for _ in range(sizes):
        n_aligned = max(2 * page_size, (n // page_size) * page_size)
        half = (n_aligned // 2 // page_size) * page_size
        points += [ProfilePoint(n_aligned, 0), ProfilePoint(n_aligned, half)]
        n //= 2
    return sorted(set(points))


class PrefillModel:
    """Online polynomial regression of prefill seconds on (n, p), with error tracking.

    ``prior``: coefficients for ``[1, m, m*p, m^2]`` (seconds, per thousand tokens); used alone
    until ``min_samples`` observations exist, then as the regularisation target.
    """

    def __init__(
        self,
        prior: Sequence[float] = (0.01, 0.05, 0.0005, 0.001),
        window: int = 512,
        min_samples: int = 6,
        refit_every: int = 8,
        prior_weight: float = 1e-5,
        error_window: int = 256,
    ) -> None:
        if len(prior) != 4:
            raise ValueError("prior needs 4 coefficients: [1, m, m*p, m^2]")
        self._prior = np.asarray(prior, dtype=float)
        self._coef = self._prior.copy()
        self._coef_f = tuple(float(c) for c in self._coef)
        if window < 4 or min_samples < 1 or refit_every < 1:
            raise ValueError("need window >= 4, min_samples >= 1, refit_every >= 1")
        # Ring buffer of the last ``window`` observations.
        self._x = np.zeros((window, 4))
        self._y = np.zeros(window)
        self._n = 0  # filled rows
        self._next = 0  # row the next observation goes to
        self._min_samples = min_samples
        self._refit_every = refit_every
        self._unfitted = 0  # observations since the last fit
        self._prior_weight = prior_weight
        self._errors: deque[float] = deque(maxlen=error_window)
        self.observations = 0

    @classmethod
    def calibrated(
        cls, fixed_s: float, per_token_s: float, attention_s_per_token2: float, **kw: float
    ) -> PrefillModel:
        """A model from a known curve: ``t = fixed + per_token * m + attn * m * (p + m/2)``."""
        a = attention_s_per_token2 * _K * _K
        prior = (fixed_s, per_token_s * _K, a, a / 2)
        return cls(prior=prior, **kw)  # type: ignore[arg-type]

    @classmethod
    def llama3_70b_8xa800(cls, **kw: float) -> PrefillModel:
        """Rough LLaMA3-70B, TP8 on 8xA800 (~1.4e11 FLOP per token at ~40% of 8x312 TFLOP/s;
        attention 80 layers x 8192 dims): 8k cold tokens ~0.95 s, 128k ~ 32 s."""
        return cls.calibrated(0.03, 1.1e-4, 2.1e-9, **kw)

    @property
    def coef(self) -> tuple[float, ...]:
        self._refit(force=True)
        return tuple(float(c) for c in self._coef)

    def predict(self, input_tokens: int, prefix_tokens: int) -> float:
        if self._unfitted:  # the common case is no new observation: skip the call
            self._refit()
        # Plain floats: this runs once or twice per candidate per request (numpy costs ~10x).
        c0, c1, c2, c3 = self._coef_f
        p = max(0, min(prefix_tokens, input_tokens)) / _K
        m = max(0, input_tokens - prefix_tokens) / _K
        return max(c0 + m * (c1 + c2 * p + c3 * m), MIN_PREDICTION_S)

    def predict_separate(self, tokens: int) -> float:
        """Prefill of ``tokens`` cold tokens spread over prompts of unknown lengths (an engine's
        waiting queue, run as one batch): the fixed and per-token cost, without the attention
        term, since prompts in one batch do not attend to each other."""
        if self._unfitted:
            self._refit()
        c0, c1, _, _ = self._coef_f
        return max(c0 + c1 * max(0, tokens) / _K, MIN_PREDICTION_S)

    def observe(self, input_tokens: int, prefix_tokens: int, seconds: float) -> None:
        """Add one measured prefill. Non-positive or non-finite times are ignored (a clock or
        bookkeeping error must not poison the fit)."""
        if not math.isfinite(seconds) or seconds <= 0 or input_tokens <= 0:
            return
        predicted = self.predict(input_tokens, prefix_tokens)
        self._errors.append(abs(predicted - seconds) / seconds)
        p = max(0, min(prefix_tokens, input_tokens)) / _K  # features(), without an array
        m = max(0, input_tokens - prefix_tokens) / _K
        self._x[self._next] = (1.0, m, m * p, m * m)
        self._y[self._next] = seconds
        self._next = (self._next + 1) % len(self._y)
        self._n = min(self._n + 1, len(self._y))
        self._unfitted += 1
        self.observations += 1

    def mape(self) -> float | None:
        """Mean absolute percentage error (as a fraction) of the predictions made just before
        each of the last ``error_window`` observations; None before any observation."""
        return float(np.mean(self._errors)) if self._errors else None

    def _refit(self, force: bool = False) -> None:
        if not self._unfitted or self._n < self._min_samples:
            return
        # Refit on every observation while the fit is young, then every ``refit_every`` (a
        # least-squares solve per routed request would dominate the routing cost).
        if not force and self._n >= 4 * self._min_samples and self._unfitted < self._refit_every:
            return
        x = self._x[: self._n]
        y = self._y[: self._n]
        rows = x / y[:, None]  # relative residuals: (x.c - y) / y
        target = np.ones_like(y)
        # Penalise relative departure from the prior; a zero prior coefficient is barely held.
        scale = np.where(self._prior != 0, np.abs(self._prior), 1e6)
        reg_rows = np.diag(np.sqrt(self._prior_weight) / scale)
        reg_target = np.sqrt(self._prior_weight) * self._prior / scale
        a = np.vstack([rows, reg_rows])
        b = np.concatenate([target, reg_target])
        coef, *_ = np.linalg.lstsq(a, b, rcond=None)
        if np.all(np.isfinite(coef)):
            self._coef = coef
            self._coef_f = tuple(float(c) for c in coef)
        self._unfitted = 0
