"""The clients' agreement verdict (benchmarks/harness/agreement.py)."""

from __future__ import annotations

import pytest

from benchmarks.harness.agreement import RunTimes, agreement, send_skew_s, statistic


def runs(client: str, *means: float) -> list[RunTimes]:
    # Three requests per run around ``mean``: mean and p90 move together with it.
    return [RunTimes(client, r, [m - 0.1, m, m + 0.1]) for r, m in enumerate(means)]


def test_within_the_spread_agrees() -> None:
    found = agreement(runs("ours", 1.00, 1.10) + runs("aiperf", 1.04, 1.12), "ours", "aiperf")
    assert [a.statistic for a in found] == ["mean", "p90"]
    mean = found[0]
    assert mean.estimate_s == pytest.approx(1.05) and mean.reference_s == pytest.approx(1.08)
    assert mean.spread_s == pytest.approx(0.10) and mean.repeats == 2
    assert mean.agrees


def test_outside_the_spread_disagrees() -> None:
    found = agreement(runs("ours", 1.00, 1.02) + runs("aiperf", 1.50, 1.51), "ours", "aiperf")
    assert not any(a.agrees for a in found)
    assert found[0].difference_s == pytest.approx(0.495)


def test_the_control_is_held_to_the_honest_clients_spread() -> None:
    # The last-chunk client's own wide range must not widen the bound it is tested against.
    all_runs = (runs("ours", 1.0, 1.1) + runs("aiperf", 1.0, 1.1)
                + runs("last", 1.0, 2.0))
    loose = agreement(all_runs, "last", "aiperf")
    held = agreement(all_runs, "last", "aiperf", spread_of=("ours", "aiperf"))
    assert loose[0].agrees and not held[0].agrees
    assert held[0].spread_s == pytest.approx(0.1)


def test_one_run_has_no_spread() -> None:
    with pytest.raises(ValueError, match=">= 2 runs"):
        agreement(runs("ours", 1.0) + runs("aiperf", 1.0, 1.1), "ours", "aiperf")
    with pytest.raises(ValueError, match=">= 2 runs"):
        agreement(runs("ours", 1.0, 1.0) + runs("aiperf", 1.0, 1.1), "ours", "aiperf",
                  spread_of=("missing",))


def test_statistics() -> None:
    assert statistic([1.0, 2.0, 3.0], "mean") == pytest.approx(2.0)
    assert statistic([float(i) for i in range(11)], "p90") == pytest.approx(9.0)
    with pytest.raises(ValueError, match="no successful request"):
        statistic([], "mean")
    with pytest.raises(ValueError, match="unknown statistic"):
        statistic([1.0], "p99")


def test_send_skew_counts_from_each_first_send() -> None:
    assert send_skew_s([0.0, 1.0, 2.0], [10.0, 11.0, 12.0]) == pytest.approx(0.0)
    assert send_skew_s([0.0, 1.0, 2.0], [5.0, 6.25, 7.0]) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="2 sends for 3"):
        send_skew_s([0.0, 1.0, 2.0], [0.0, 1.0])
