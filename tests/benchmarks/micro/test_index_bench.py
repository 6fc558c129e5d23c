"""Smoke run of benchmarks/micro/index_bench.py on the trace sample: it runs, writes JSON, evicts,
and the index stays consistent with the simulated worker tiers (and the check can fail)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.micro import index_bench
from radix_global.index import GlobalIndex
from radix_global.ops import IndexOp, RemovePages

SAMPLE = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "conversation_sample.jsonl"
ARGS = [
    "--trace",
    str(SAMPLE),
    "--limit",
    "60",
    "--workers",
    "4",
    "--worker-tokens",
    "20000",
    "--sample-every",
    "20",
    "--baseline-prompts",
    "0",
]


def test_smoke_run_writes_json_and_stays_consistent(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    res = index_bench.main([*ARGS, "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["requests"] == 60 == res["requests"]
    assert saved["refused"] == {}
    assert saved["consistency_checked"] > 1 and saved["consistency_errors"] == 0
    assert len(saved["memory_series"]) == 3
    assert saved["memory_series"][-1]["evicted_pages"] > 0  # the LRUs really evicted
    assert saved["match_us_p99"] > 0 and saved["pages_applied_per_s"] > 0
    assert saved["baseline"] == {"skipped": "--baseline-prompts 0"}


def test_consistency_check_catches_an_index_that_drops_removals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = GlobalIndex.apply

    def drop_removals(self: GlobalIndex, op: IndexOp) -> Any:
        if not isinstance(op, RemovePages):
            original(self, op)

    monkeypatch.setattr(GlobalIndex, "apply", drop_removals)
    res = index_bench.main([*ARGS, "--json", str(tmp_path / "b.json")])
    assert res["consistency_errors"] > 0
