"""Do two clients measure the same TTFT? The verdict of ``client_agreement`` (pure, no I/O).

Each client replays the same plan several times (engines' caches emptied between runs). Per
statistic (mean, p90 of the run's TTFTs) a client's estimate is its average over the repeats;
the run-to-run spread is the widest range (max - min over the repeats) either client showed.
The clients agree where their estimates differ by no more than that spread: a difference the
noise of running again could produce. A client that times TTFT at the last chunk of the stream
(end-to-end latency) is the negative control: held to the same bound (the spread of the two
clients that time the first chunk), it must fall outside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import NamedTuple

from radix_global_tools.replay.stats import percentile

STATISTICS = ("mean", "p90")


class RunTimes(NamedTuple):
    """One run of one client: its requests' TTFTs (seconds; failures left out)."""

    client: str
    repeat: int
    ttfts: Sequence[float]


class Agreement(NamedTuple):
    """``client`` against ``reference`` on one statistic: both estimates, the bound and
    whether the difference stays within it."""

    statistic: str  # mean | p90
    client: str
    reference: str
    estimate_s: float  # ``client``'s, averaged over its repeats
    reference_s: float
    spread_s: float  # the widest run-to-run range of either client
    repeats: int  # the fewer repeats of the two clients

    @property
    def difference_s(self) -> float:
        return abs(self.estimate_s - self.reference_s)

    @property
    def agrees(self) -> bool:
        return self.difference_s <= self.spread_s


def statistic(ttfts: Sequence[float], name: str) -> float:
    """One run's ``name`` (of :data:`STATISTICS`) over its TTFTs; ValueError for none or an
    unknown name."""
    if not ttfts:
        raise ValueError("a run with no successful request has no TTFT statistic")
    if name == "mean":
        return fmean(ttfts)
    if name == "p90":
        value = percentile(ttfts, 90)
        assert value is not None
        return value
    raise ValueError(f"unknown statistic {name!r} (of {STATISTICS})")


def agreement(runs: Sequence[RunTimes], client: str, reference: str,
              spread_of: Sequence[str] = ()) -> list[Agreement]:
    """``client`` against ``reference`` per statistic; the spread is that of ``spread_of``
    (default: the two of them). Needs >= 2 runs of each client named: one run has no spread,
    and a bound of zero would make any two clients disagree."""
    names = list(dict.fromkeys((client, reference, *(spread_of or (client, reference)))))
    by = {name: [r for r in runs if r.client == name] for name in names}
    if min(len(v) for v in by.values()) < 2:
        raise ValueError(f"agreement needs >= 2 runs of each of {names}")
    out = []
    for name in STATISTICS:
        values = {k: [statistic(r.ttfts, name) for r in v] for k, v in by.items()}
        spread = max(max(values[k]) - min(values[k]) for k in (spread_of or (client, reference)))
        out.append(Agreement(name, client, reference, fmean(values[client]),
                             fmean(values[reference]), spread,
                             min(len(values[client]), len(values[reference]))))
    return out


def send_skew_s(planned_s: Sequence[float], sent_s: Sequence[float]) -> float:
    """The largest gap between when a client sent its k-th request and when the plan said to,
    both counted from the first send (how faithfully it kept the schedule)."""
    if len(planned_s) != len(sent_s) or not planned_s:
        raise ValueError(f"{len(sent_s)} sends for {len(planned_s)} planned requests")
    p, s = sorted(planned_s), sorted(sent_s)
    return max(abs((b - s[0]) - (a - p[0])) for a, b in zip(p, s, strict=True))
