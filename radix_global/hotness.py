"""Decayed hit counting: how hot a prefix is, with an exponential half-life.

Pure arithmetic on an injected clock (``now`` in seconds, any origin): nothing here reads the
wall clock, so the simulator can drive it. A counter is a pair ``(hits, stamp)``: ``hits`` was
exact at time ``stamp`` and halves every ``half_life_s`` after it. A hit at ``now`` makes it
``(value(hits, stamp, now) + 1, max(stamp, now))``: ``RadixTree.match`` does that inline, on the
router's hot path.
"""

from __future__ import annotations

import math

DEFAULT_HALF_LIFE_S = 60.0


class Decay:
    """Exponential decay with a fixed half-life; all methods are pure."""

    __slots__ = ("_k", "half_life_s")

    @property
    def rate_constant(self) -> float:
        """ln 2 / half-life: ``hits * exp(-dt * rate_constant)`` decays ``dt`` seconds."""
        return self._k

    def __init__(self, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s!r}")
        self.half_life_s = float(half_life_s)
        self._k = math.log(2.0) / self.half_life_s

    def value(self, hits: float, stamp: float, now: float) -> float:
        """``hits`` counted at ``stamp``, decayed to ``now``. A clock that went backwards
        (``now < stamp``) decays nothing rather than inflating the count."""
        if now <= stamp:
            return hits
        return hits * math.exp((stamp - now) * self._k)

    def rate(self, hits: float, stamp: float, now: float) -> float:
        """Hits per second: a steady rate r keeps the decayed count at r * half_life / ln 2."""
        return self.value(hits, stamp, now) * self._k
