"""benchmarks/scenarios/ttft_residual.py: the predicted-TTFT residual by in-flight requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scenarios.ttft_residual import in_flight_at_send, main, residuals_by_in_flight
from radix_global_tools.replay.stats import RequestResult


def req(i: int, sent: float, latency: float, ttft: float, pred: float | None,
        worker: str | None = "w0") -> RequestResult:
    return RequestResult(i, "ok", sent, sent, 100, 4, 200, ttft, latency, worker=worker,
                         router_ttft_s=pred)


def test_residuals_are_grouped_by_what_was_in_flight_on_the_same_worker() -> None:
    a = req(0, 0.0, 2.0, 0.5, 0.1)  # nothing before it
    b = req(1, 1.0, 2.0, 0.9, 0.1)  # a in flight
    c = req(2, 2.5, 1.0, 1.0, 0.2)  # b in flight (a ended at 2.0)
    other = req(3, 1.5, 5.0, 0.3, 0.1, worker="w1")  # another worker: never counted for w0
    peer = req(4, 1.2, 1.0, 0.3, None, worker=None)  # a peer router's request: no prediction
    assert in_flight_at_send(c, [a, b, c]) == 1
    got = residuals_by_in_flight([a, b, c, other, peer])
    assert set(got) == {"w0", "w1"}
    assert got["w0"][0] == [pytest.approx(0.4)]
    assert sorted(got["w0"][1]) == [pytest.approx(0.8), pytest.approx(0.8)]
    assert got["w1"] == {0: [pytest.approx(0.2)]}


def test_the_table_reads_a_pressure_result(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    detail = [req(0, 0.0, 2.0, 0.5, 0.1).to_json(), req(1, 1.0, 2.0, 0.9, 0.1).to_json()]
    runs = [{"contender": "ours", "workload": "agents", "load": "x", "requests_detail": detail},
            {"contender": "skipped one", "workload": "agents", "load": "x", "skipped": "error"}]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"runs": runs}))
    assert main(["--real", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| ours | agents @ x | 1 | w0 | 2 | +0.40 s (1) | +0.80 s (1) | - | - | - |" in out
