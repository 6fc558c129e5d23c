"""A very short real side-by-side run: real SGLang engines on CPU, real routers, real replay.

One contender per engine kind (at most 2 engines at a time): sglang-router ``cache_aware`` over
stock SGLang, and our Conductor over workers started with ``radix-global sglang`` (L3 pool on).
Checks that both replays completed every request, that the engines' usage reports show prefix
reuse (the plan repeats conversation turns), and that the table, JSON and CDF plot are written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scenarios import bench

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]


def test_headline_pair_runs_and_reports(tiny_model_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = bench.main(["--trace", str(bench.SAMPLE_TRACE), "--model-dir", str(tiny_model_dir),
                     "--headline-only", "--conversations", "2", "--duration-s", "10",
                     "--max-output-tokens", "4", "--target-mean-prompt", "512",
                     "--ttft-slo-s", "600", "--budget-s", "1500", "--out", str(out),
                     "--run-dir", str(tmp_path / "run")])
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    rows = {r["contender"]: r for r in data["contenders"]}
    assert rc == 0, printed
    for c in bench.HEADLINE:
        row = rows[c.name]
        assert not row.get("skipped"), row
        assert row["ok"] == row["requests"] == data["plan"]["requests"], row
        assert row["ttft_mean_s"] > 0 and row["ttft_p90_s"] >= row["ttft_p50_s"]
        # the 2 conversations repeat turns: some prefix must have been served from a cache
        assert row["prefix_tokens_reused"] > 0, row
    assert data["verdict"]["beats_mean"] is not None
    assert "TTFT mean" in printed and "headline:" in printed
    assert out.with_name("bench_ttft_cdf.png").stat().st_size > 1000
