"""The drag of running requests on a first token (router/routing/drag_model.py)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.routing.drag_model import DragModel


def test_learns_a_base_and_a_per_request_cost_from_noisy_residuals() -> None:
    model = DragModel()
    rng = random.Random(3)
    for _ in range(200):
        k = rng.randrange(0, 5)
        model.observe(k, 0.3 + 0.2 * k + rng.uniform(-0.05, 0.05))
    fit = model.fit()
    assert fit.base_s == pytest.approx(0.3, abs=0.03)
    assert fit.per_request_s == pytest.approx(0.2, abs=0.02)
    assert model.predict(3) == pytest.approx(0.9, abs=0.06)


def test_nothing_before_enough_observations_and_never_below_zero() -> None:
    model = DragModel(min_observations=4)
    for _ in range(3):
        model.observe(2, 1.0)
    assert model.predict(2) == 0.0
    model.observe(2, 1.0)
    assert model.predict(2) == pytest.approx(1.0)  # one k seen: the mean, no slope
    over = DragModel(min_observations=2)  # the profile overpredicts: no negative drag
    for k in (0, 1, 2, 0, 1, 2):
        over.observe(k, -0.5)
    assert over.predict(0) == 0.0 and over.predict(5) == 0.0


def test_a_falling_residual_gives_no_negative_slope() -> None:
    model = DragModel(min_observations=2)
    for k in (0, 1, 2, 3) * 5:
        model.observe(k, 1.0 - 0.2 * k)  # noise that would make a busy slot look faster
    fit = model.fit()
    assert fit.per_request_s == 0.0
    assert fit.base_s == pytest.approx(0.7, abs=0.02)  # the (recency-weighted) mean residual
    assert model.predict(10) == pytest.approx(fit.base_s)


def test_recent_observations_win_over_old_ones() -> None:
    model = DragModel(half_life=8, min_observations=2)
    for k in (0, 1, 2, 3) * 20:
        model.observe(k, 0.5 * k)
    for k in (0, 1, 2, 3) * 20:
        model.observe(k, 0.1)
    assert model.predict(3) == pytest.approx(0.1, abs=0.02)


def test_bad_input_is_refused_or_ignored_and_outliers_are_capped() -> None:
    with pytest.raises(ValueError):
        DragModel(half_life=0)
    with pytest.raises(ValueError):
        DragModel(min_observations=1)
    model = DragModel(min_observations=2, max_residual_s=2.0)
    with pytest.raises(ValueError):
        model.observe(-1, 0.1)
    model.observe(0, math.nan)
    model.observe(0, math.inf)
    assert model.observations == 0
    model.observe(0, 1000.0)  # a stalled request counts as 2 s
    model.observe(0, 0.0)
    assert model.predict(0) == pytest.approx(1.0, rel=0.02)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.floats(-5, 5)), min_size=2, max_size=60),
       st.floats(4.0, 100.0))
def test_the_fit_is_weighted_least_squares(points: list[tuple[int, float]],
                                           half_life: float) -> None:
    """Against a brute-force weighted least-squares fit of the same points (numpy), with the
    slope clipped at 0 and none where k (weighted) did not vary, as documented."""
    model = DragModel(half_life=half_life, min_observations=2, max_residual_s=10.0)
    for k, y in points:
        model.observe(k, y)
    decay = 0.5 ** (1.0 / half_life)
    w = np.array([decay ** (len(points) - 1 - i) for i in range(len(points))])
    k = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points])
    fit = model.fit()
    mean_k = np.sum(w * k) / np.sum(w)
    if np.sum(w * (k - mean_k) ** 2) / np.sum(w) <= 1e-9:
        slope = 0.0
    else:
        sw = np.sqrt(w)
        slope, _ = np.linalg.lstsq(np.stack([k, np.ones_like(k)], 1) * sw[:, None], y * sw,
                                   rcond=None)[0]
    if slope <= 0:
        slope = 0.0
    base = float(np.sum(w * (y - slope * k)) / np.sum(w))
    assert fit.per_request_s == pytest.approx(slope, rel=1e-6, abs=1e-6)
    assert fit.base_s == pytest.approx(base, rel=1e-6, abs=1e-6)
