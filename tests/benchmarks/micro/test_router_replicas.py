"""The several-routers benchmark's pure parts: the rounds' rotated order, the CPU ratios to one
router, the delay summary."""

from __future__ import annotations

from benchmarks.harness.spread import rotated
from benchmarks.micro.router_replicas import ratios, summary


def test_each_round_rotates_the_order() -> None:
    assert [rotated(("1", "2", "3"), r) for r in range(4)] == [
        ["1", "2", "3"], ["2", "3", "1"], ["3", "1", "2"], ["1", "2", "3"]]
    assert rotated([], 2) == []


def test_ratios_are_to_one_router() -> None:
    assert ratios({"1": 0.5, "2": 0.75, "3-alone": 1.0}) == {"1": 1.0, "2": 1.5, "3-alone": 2.0}
    assert ratios({"1": 0.0, "2": 0.5}) == {"1": None, "2": None}


def test_summary_of_delays() -> None:
    assert summary([]) is None
    s = summary([float(x) for x in range(1, 11)])
    assert s is not None
    assert (s["median"], s["p90"], s["max"], s["n"]) == (5.5, 10.0, 10.0, 10)
