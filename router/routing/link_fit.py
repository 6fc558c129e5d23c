"""What a link's measured transfers say about it: ``seconds = overhead_s + bytes / bandwidth``.

A transfer pays a fixed cost per call (a round trip, a lookup) besides its bytes, so the rate of a
small transfer understates the link: a rate averaged over transfers of mixed sizes would price a
large fetch too slow. A least-squares line through (bytes, seconds), with older samples decayed
(half their weight after ``half_life`` newer ones), separates the two. While the samples do not
pin a line (all of one size, or a slope that is not positive) the estimate is the ratio of their
bytes to their seconds, with no overhead. Pure.
"""

from __future__ import annotations

from typing import NamedTuple


class LinkEstimate(NamedTuple):
    bandwidth_Bps: float
    overhead_s: float


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

    def estimate(self) -> LinkEstimate | None:
        """The link as measured; None until ``min_samples`` samples weigh in."""
        if self.samples < self.min_samples or self._y <= 0:
            return None
        w = self._w
        mx, my = self._x / w, self._y / w
        var = self._xx / w - mx * mx
        if var > (1e-3 * mx) ** 2:  # sizes differ enough to tell a slope from a constant
            slope = (self._xy / w - mx * my) / var
            overhead = my - slope * mx
            if slope > 0 and overhead >= 0:
                return LinkEstimate(1.0 / slope, overhead)
        return LinkEstimate(self._x / self._y, 0.0)
