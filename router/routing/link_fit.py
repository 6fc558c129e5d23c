"""What a link's measured transfers say about it: ``seconds = overhead_s + bytes / bandwidth``.

A transfer pays a fixed cost per call (a round trip, a lookup) besides its bytes, so the rate of a
small transfer understates the link: a rate averaged over transfers of mixed sizes would price a
large fetch too slow. A least-squares line through (bytes, seconds), with older samples decayed
(half their weight after ``half_life`` newer ones), separates the two. While the samples do not
pin a line (all of one size, or a slope that is not positive) the estimate is the ratio of their
bytes to their seconds, with no overhead. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple


class LinkEstimate(NamedTuple):
    bandwidth_Bps: float
    overhead_s: float


class LinkStats(NamedTuple):
    """A fit's sums: samples seen, decayed weight, bytes, seconds, bytes², bytes x seconds.
    Sums add: the stats of fits that each saw some of a link's samples, added, are one fit of
    them all (each weighed by its own fit's decay), which is how routers share a link."""

    samples: int
    w: float
    x: float
    y: float
    xx: float
    xy: float


NO_STATS = LinkStats(0, 0.0, 0.0, 0.0, 0.0, 0.0)


def summed(stats: Iterable[LinkStats]) -> LinkStats:
    return LinkStats(*(sum(column) for column in zip(NO_STATS, *stats, strict=True)))


def estimate_of(stats: LinkStats, min_samples: int) -> LinkEstimate | None:
    """The link the sums describe; None until ``min_samples`` samples weigh in, or when they
    describe no link (no bytes, or numbers past a float's range: sums read from a peer)."""
    if stats.samples < min_samples or stats.y <= 0 or stats.w <= 0:
        return None
    w = stats.w
    mx, my = stats.x / w, stats.y / w
    var = stats.xx / w - mx * mx
    found = LinkEstimate(stats.x / stats.y, 0.0)
    if var > (1e-3 * mx) * (1e-3 * mx):  # sizes differ enough to tell a slope from a constant
        slope = (stats.xy / w - mx * my) / var
        overhead = my - slope * mx
        if slope > 0 and overhead >= 0:
            found = LinkEstimate(1.0 / slope, overhead)
    ok = 0 < found.bandwidth_Bps < math.inf and 0 <= found.overhead_s < math.inf
    return found if ok else None


class LinkFit:
    def __init__(self, half_life: float = 32.0, min_samples: int = 4) -> None:
        if half_life <= 0 or min_samples < 1:
            raise ValueError("half_life must be > 0 and min_samples >= 1")
        self._decay = 0.5 ** (1.0 / half_life)
        self.min_samples = min_samples
        self.samples = 0  # seen, all told
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, nbytes: float, seconds: float) -> None:
        self.samples += 1
        d = self._decay
        self._w = self._w * d + 1.0
        self._x = self._x * d + nbytes
        self._y = self._y * d + seconds
        self._xx = self._xx * d + nbytes * nbytes
        self._xy = self._xy * d + nbytes * seconds

    def stats(self) -> LinkStats:
        return LinkStats(self.samples, self._w, self._x, self._y, self._xx, self._xy)

    def estimate(self) -> LinkEstimate | None:
        """The link as measured; None until ``min_samples`` samples weigh in."""
        return estimate_of(self.stats(), self.min_samples)
