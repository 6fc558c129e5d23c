"""aiperf as an independent client (benchmarks/harness/aiperf.py): the dataset it replays, the
tokenizer cache it reads, and its records read back. The record lines are the shape aiperf
0.13.0 wrote in a real run (``benchmarks.scenarios.client_agreement``), trimmed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.harness.aiperf import (
    AiperfError,
    read_records,
    tokenizer_cache,
    write_dataset,
)
from radix_global.trace import TraceRequest, prompt_text
from radix_global_tools.replay.plan import PlannedRequest


def planned(position: int, at: float, ids: list[int], out: int = 4,
            after: int | None = None) -> PlannedRequest:
    return PlannedRequest(position, at, ids, out, TraceRequest(at * 1000, len(ids), out, ()),
                          after)


def test_dataset_sends_the_plans_text_at_its_times(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    plan = [planned(1, 2.5, [207, 208, 209], 3), planned(0, 1.0, [205, 206], 2)]
    assert write_dataset(plan, path) == 2
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [
        {"timestamp": 0.0, "text_input": prompt_text([205, 206]), "output_length": 2},
        {"timestamp": 1500.0, "text_input": prompt_text([207, 208, 209]), "output_length": 3}]


def test_a_closed_loop_plan_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="open loop"):
        write_dataset([planned(0, 0.0, [201]), planned(1, 1.0, [201, 202], after=0)],
                      tmp_path / "d.jsonl")


def test_tokenizer_cache_layout(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "config.json").write_text("{}")
    name = tokenizer_cache(model, tmp_path / "hf", "local/tiny")
    entry = tmp_path / "hf" / "hub" / "models--local--tiny"
    snap = (entry / "refs" / "main").read_text()
    assert name == "local/tiny"
    assert sorted(p.name for p in (entry / "snapshots" / snap).iterdir()) == [
        "config.json", "tokenizer.json"]
    with pytest.raises(AiperfError, match=r"no tokenizer\.json"):
        tokenizer_cache(tmp_path / "hf", tmp_path / "hf2")


def record(start_ns: int, ttft_ms: float | None, latency_ms: float = 1218.2,
           error: dict[str, object] | None = None) -> str:
    metrics = {"request_latency": {"value": latency_ms, "unit": "ms"},
               "output_sequence_length": {"value": 16, "unit": "tokens"},
               "usage_prompt_cache_read_tokens": {"value": 1024, "unit": "tokens"}}
    if ttft_ms is not None:
        metrics["time_to_first_token"] = {"value": ttft_ms, "unit": "ms"}
    row: dict[str, object] = {
        "metadata": {"session_num": 1, "turn_index": 0, "credit_issued_ns": start_ns - 6_000,
                     "request_start_ns": start_ns, "request_end_ns": start_ns + 10**9,
                     "benchmark_phase": "profiling", "was_cancelled": False},
        "metrics": metrics}
    if error is not None:
        row["error"] = error
    return json.dumps(row)


def test_records_in_send_order_in_seconds(tmp_path: Path) -> None:
    (tmp_path / "profile_export.jsonl").write_text("\n".join([
        record(1_796_646_459_000_000_000, 500.0),
        record(1_796_646_457_620_618_343, 878.89),
        record(1_796_646_460_000_000_000, None, error={"code": 500, "message": "boom"}),
    ]) + "\n")
    got = read_records(tmp_path)
    assert [round(r.sent_s, 6) for r in got] == [0.0, 1.379382, 2.379382]
    assert got[0].ttft_s == pytest.approx(0.87889) and got[0].latency_s == pytest.approx(1.2182)
    assert got[2].ttft_s is None and got[2].latency_s is None  # failed: no TTFT counted
    assert got[0].cached_tokens == 1024


@pytest.mark.parametrize("text, match", [
    ("", "wrote no"), ("\n", "has no records"), ('{"metrics": {}}\n', "not an aiperf record"),
    ("not json\n", "not an aiperf record")])
def test_unreadable_records_raise(tmp_path: Path, text: str, match: str) -> None:
    if text:
        (tmp_path / "profile_export.jsonl").write_text(text)
    with pytest.raises(AiperfError, match=match):
        read_records(tmp_path)


def test_an_unknown_unit_raises(tmp_path: Path) -> None:
    row = json.loads(record(1, 5.0))
    row["metrics"]["time_to_first_token"]["unit"] = "fortnights"
    (tmp_path / "profile_export.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(AiperfError, match="fortnights"):
        read_records(tmp_path)


def test_warm_up_records_are_left_out_and_cancelled_ones_failed(tmp_path: Path) -> None:
    warm = json.loads(record(1, 5.0))
    warm["metadata"]["benchmark_phase"] = "warmup"
    cancelled = json.loads(record(3, 7.0))
    cancelled["metadata"]["was_cancelled"] = True
    (tmp_path / "profile_export.jsonl").write_text(
        "\n".join(json.dumps(r) for r in (warm, json.loads(record(2, 6.0)), cancelled)) + "\n")
    got = read_records(tmp_path)
    assert [r.ttft_s for r in got] == [pytest.approx(0.006), None]
