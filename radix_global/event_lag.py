"""How far the index is behind its engines: for each live KV event batch, the subscriber's wall
clock minus the batch's ``ts`` (the publisher's ``time.time()``). Pure: the caller measures.

Contract (``docs/interfaces.md``, "What the cache is worth, live", its bullet on each feed's
lag): a histogram over every feed and, per worker, the last live batch's lag. A ``ts`` of 0 or
below, or not finite (a publisher that stamps none), says nothing and is not counted; a negative
lag (the publisher's clock ahead of ours) counts as 0 in the histogram and stays as is in the
per-worker value, where an operator can see the clock offset.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import NamedTuple

LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LagStats(NamedTuple):
    bounds_s: tuple[float, ...]  # the buckets' upper bounds; a last bucket past them is +Inf
    counts: tuple[int, ...]  # batches per bucket (len(bounds_s) + 1), not cumulative
    sum_s: float  # of the histogram's (clamped) lags
    by_worker: dict[str, float]  # worker -> its last live batch's lag, as measured


class EventLag:
    """Lags of live batches, by bucket and by worker."""

    __slots__ = ("_by_worker", "_counts", "_sum")

    def __init__(self) -> None:
        self._counts = [0] * (len(LAG_BUCKETS_S) + 1)
        self._sum = 0.0
        self._by_worker: dict[str, float] = {}

    def observe(self, worker: str, ts: float, now: float) -> None:
        """A live batch stamped ``ts`` from ``worker`` arrived at ``now`` (both wall clock)."""
        if not 0.0 < ts < math.inf:  # none stamped (0), or NaN / inf: nothing to learn
            return
        lag = now - ts
        self._by_worker[worker] = lag
        clamped = max(lag, 0.0)
        self._counts[bisect_left(LAG_BUCKETS_S, clamped)] += 1
        self._sum += clamped

    def forget(self, worker: str) -> None:
        """``worker`` left: its last lag is no longer exported."""
        self._by_worker.pop(worker, None)

    def stats(self) -> LagStats:
        return LagStats(LAG_BUCKETS_S, tuple(self._counts), self._sum, dict(self._by_worker))
