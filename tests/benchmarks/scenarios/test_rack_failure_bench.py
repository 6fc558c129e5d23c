"""The rack-failure bench's simulated side and its table (the measured side needs root and
engines: run by hand, recorded in docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scenarios import rack_failure_bench as bench


def test_the_prediction_runs_every_budget_and_only_copies_spend_pages(tmp_path: Path) -> None:
    out = tmp_path / "rf.json"
    assert bench.main(["--simulate-only", "--budgets", "0,1", "--warm", "24",
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["runs"] == []
    by_budget = {p["budget"]: p for p in doc["predicted"]}
    assert by_budget[0]["copies"]["pages"] == 0 < by_budget[1]["copies"]["pages"]
    for p in by_budget.values():
        assert p["after"]["requests"] == 60 and p["after"]["failed"] == 0
        assert 0 < p["after"]["reuse"] <= 1 and p["warm"]["ttft_mean_s"] > 0
    assert [(r["budget"], r["source"]) for r in doc["summary"]] == [
        (0, "simulated"), (1, "simulated")]


def test_the_table_prints_a_range_only_where_runs_differ() -> None:
    one = {"warm": bench.phase([]), "after": bench.phase([
        {"ok": True, "ttft_s": 0.5, "tokens": 100, "cached": 50, "storage": 10},
        {"ok": False}])}
    runs = [{"budget": 1, "copies": {"pages": p}, "pool_pages": 9, **one} for p in (4, 6)]
    (row,) = bench.summary(runs, [1, 2], "measured")
    assert row["after_failed"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    text = bench.table([row])
    assert "| 1 | measured | 5 (4-6) / 9 | - / - | 0.00 | 0.500 / 0.500 | 0.50 | 10 | 1 |" in text


def test_budgets_beyond_the_racks_are_refused() -> None:
    with pytest.raises(SystemExit):
        bench.main(["--simulate-only", "--budgets", "3"])
