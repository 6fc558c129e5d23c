"""router/routing/link_fit.py: a link's bandwidth and per-transfer overhead from its transfers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.routing.link_fit import LinkFit, estimate_of, summed


@settings(max_examples=60, deadline=None)
@given(bandwidth=st.floats(1e6, 1e11), overhead=st.floats(0, 0.05),
       sizes=st.lists(st.integers(1 << 12, 1 << 30), min_size=4, max_size=40),
       half_life=st.floats(2, 100))
def test_the_fit_is_weighted_least_squares(bandwidth, overhead, sizes, half_life) -> None:
    """Against numpy's weighted polyfit over the same decayed weights (the brute-force model);
    noise-free samples give the link back."""
    fit = LinkFit(half_life=half_life)
    seconds = [overhead + s / bandwidth for s in sizes]
    for s, y in zip(sizes, seconds, strict=True):
        fit.observe(s, y)
    got = fit.estimate()
    assert got is not None
    if len(set(sizes)) == 1:  # one size: no line, the ratio
        assert got.overhead_s == 0.0
        assert got.bandwidth_Bps == pytest.approx(sum(sizes) / sum(seconds))
        return
    d = 0.5 ** (1 / half_life)
    w = np.array([d ** (len(sizes) - 1 - i) for i in range(len(sizes))])
    slope, intercept = np.polyfit(np.array(sizes, float), np.array(seconds), 1, w=np.sqrt(w))
    if intercept < -1e-9 or slope <= 0:
        return  # numerically degenerate for numpy too
    assert got.bandwidth_Bps == pytest.approx(1 / slope, rel=1e-3)
    assert got.bandwidth_Bps == pytest.approx(bandwidth, rel=1e-3)
    assert got.overhead_s == pytest.approx(overhead, abs=1e-6 + 1e-3 * overhead)


def test_nothing_before_enough_samples_and_no_negative_overhead() -> None:
    fit = LinkFit(min_samples=3)
    fit.observe(100, 1.0)
    fit.observe(200, 1.0)
    assert fit.estimate() is None
    fit.observe(300, 1.1)  # faster than a line through zero: overhead would be negative
    est = fit.estimate()
    assert est is not None and est.overhead_s >= 0.0
    slope_only = LinkFit(min_samples=2)
    slope_only.observe(100, 0.5)
    slope_only.observe(300, 1.0)  # line: 0.25 s + 400 B/s
    assert slope_only.estimate() == pytest.approx((400.0, 0.25))
    with pytest.raises(ValueError):
        LinkFit(min_samples=0)


def test_older_samples_fade() -> None:
    """A link that slowed down (congestion) is believed slow after a few half-lives."""
    fit = LinkFit(half_life=4)
    for i in range(20):
        fit.observe(1000 * (1 + i % 3), (1 + i % 3) * 1.0)  # 1,000 B/s
    for i in range(40):
        fit.observe(1000 * (1 + i % 3), (1 + i % 3) * 10.0)  # 100 B/s
    est = fit.estimate()
    assert est is not None and est.bandwidth_Bps == pytest.approx(100.0, rel=0.02)


@settings(max_examples=60, deadline=None)
@given(samples=st.lists(st.tuples(st.integers(1, 1 << 30), st.floats(1e-4, 10.0)), min_size=1,
                        max_size=30),
       cut=st.integers(0, 30))
def test_the_sums_of_two_fits_are_one_fit_of_all_their_samples(samples, cut) -> None:
    """Routers share a link by adding their fits' sums: without decay, the sums of two fits
    that each saw part of the samples are those of one fit that saw them all."""
    whole, first, second = (LinkFit(half_life=float("inf")) for _ in range(3))
    for i, (nbytes, seconds) in enumerate(samples):
        whole.observe(nbytes, seconds)
        (first if i < cut else second).observe(nbytes, seconds)
    together = summed([first.stats(), second.stats()])
    assert together.samples == whole.stats().samples
    assert together == pytest.approx(whole.stats(), rel=1e-9)
    got, want = estimate_of(together, 4), whole.estimate()
    assert (got is None) == (want is None)
    assert got is None or got == pytest.approx(want, rel=1e-6, abs=1e-9)
