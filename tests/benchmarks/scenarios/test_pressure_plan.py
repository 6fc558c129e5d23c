"""The cache-pressure scenario: its committed configuration, the agent plan, the working set and
the verdicts against issue 15's targets (pure parts of benchmarks/pressure_*.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.scenarios import pressure_bench
from benchmarks.scenarios.pressure_bench import demo_point
from benchmarks.scenarios.pressure_plan import (
    PressureConfigError,
    agent_plan,
    conversation_plan,
    load_config,
    working_set_tokens,
)
from benchmarks.scenarios.pressure_report import (
    demo_sentence,
    prediction_error_s,
    spread,
    table,
    verdicts,
)

SAMPLE = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / (
    "conversation_multiturn_sample.jsonl")


def test_the_committed_scenario_puts_the_caches_under_pressure() -> None:
    cfg = load_config()
    assert cfg.local_tokens == cfg.device_tokens * cfg.hicache_ratio
    plan, _ = conversation_plan(cfg.conversations, SAMPLE, cfg.page_size,
                                cfg.conversations.durations_s[0])
    ws = working_set_tokens([p.input_ids for p in plan], cfg.page_size)
    pool_tokens = cfg.pool_capacity_gb * 1e9 / 6144  # the tiny model's KV bytes per token
    assert 3 * cfg.local_tokens <= ws <= pool_tokens, (ws, cfg.local_tokens)
    assert len(cfg.conversations.durations_s) >= 3 and len(cfg.agents.rates) >= 3


def test_a_wrong_key_or_value_is_a_clear_error(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "pressure.toml"
            ).read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("think_s", "thinking_s"))
    with pytest.raises(PressureConfigError, match="thinking_s"):
        load_config(bad)
    bad.write_text(text.replace("hicache_ratio = 2", "hicache_ratio = 1"))
    with pytest.raises(PressureConfigError, match="hicache_ratio"):
        load_config(bad)


def test_a_turn_waits_for_its_sessions_previous_answer_when_configured() -> None:
    a = load_config().agents
    assert a.think_after_answer  # the committed scenario (since run 9)
    plan = agent_plan(a, 0.4)
    by_pos = {p.position: p for p in plan}
    later = [p for p in plan if p.after is not None]
    assert later and len(later) == len(plan) - a.sessions  # every turn but each session's first
    for p in later:
        prev = by_pos[p.after]
        assert p.input_ids[:len(prev.input_ids)] == prev.input_ids  # its own session's turn
        assert p.think_s == a.think_s and p.send_at_s == pytest.approx(prev.send_at_s + a.think_s)
    assert all(p.after is None for p in agent_plan(replace(a, think_after_answer=False), 0.4))


def test_agent_sessions_grow_their_prompt_and_every_load_sends_the_same_requests() -> None:
    a = load_config().agents
    slow, fast = agent_plan(a, 0.25), agent_plan(replace(a), 0.5)
    assert sorted(map(tuple, (p.input_ids for p in slow))) == sorted(
        map(tuple, (p.input_ids for p in fast)))
    assert max(p.send_at_s for p in fast) < max(p.send_at_s for p in slow)
    assert [p.send_at_s for p in slow] == sorted(p.send_at_s for p in slow)
    def extends_a_turn(p: Any) -> bool:  # its session's earlier turn is a prefix of it
        return any(len(q.input_ids) < len(p.input_ids)
                   and p.input_ids[:len(q.input_ids)] == q.input_ids for q in slow)

    assert sum(map(extends_a_turn, slow)) == len(slow) - a.sessions  # all but first turns
    systems = {tuple(p.input_ids[:1024]) for p in slow}
    assert len(systems) == len(a.system_prompts)  # sessions share a few system prompts


def test_working_set_counts_distinct_pages() -> None:
    assert working_set_tokens([[1, 2, 3, 4], [1, 2, 5, 6], [1, 2]], 2) == 6


def _row(name: str, mean: float, p90: float, delivered: int) -> dict[str, Any]:
    reuse = {"prompt_tokens": 1000, "available": 800, "captured": None, "delivered": delivered,
             "delivered_device": None, "delivered_host": None, "delivered_storage": 0,
             "late": None, "available_fraction": 0.8, "captured_fraction": None,
             "delivered_fraction": delivered / 1000}
    return {"contender": name, "workload": "w", "load": "x1", "ok": 10, "requests": 10,
            "ttft_mean_s": mean, "ttft_p50_s": mean, "ttft_p90_s": p90, "ttft_p99_s": p90,
            "tbt_p90_s": 0.01, "slo_attainment": 1.0, "reuse": reuse}


def test_verdicts_check_the_targets_against_both_baselines() -> None:
    rows = [_row("local", 1.0, 2.0, 300), _row("l3", 0.8, 1.6, 500), _row("ours", 0.7, 1.4, 600)]
    [v] = verdicts(rows, "local", "l3", "ours")
    assert v["meets_local_target"] and v["ahead_of_shared_l3"], v
    rows[2] = _row("ours", 0.7, 1.7, 600)  # p90 0.85x of local, behind the shared L3
    [v] = verdicts(rows, "local", "l3", "ours")
    assert not v["meets_local_target"] and not v["ahead_of_shared_l3"]
    assert "MISSED" in v["text"] and "NOT ahead" in v["text"]
    lines = table(rows).splitlines()
    assert len(lines) == 2 + len(rows) and lines[-1].startswith("ours")
    head = lines[0].split()
    # no prediction; the row has 2 words fewer before it ("TTFT mean", "TBT p90" are 2 each)
    assert lines[-1].split()[head.index("capt") - 2] == "-"


def test_the_prediction_error_is_the_median_of_measured_minus_predicted() -> None:
    detail = [{"ttft_s": 1.0, "router_ttft_s": 0.25}, {"ttft_s": 0.5, "router_ttft_s": 0.5},
              {"ttft_s": 2.0, "router_ttft_s": 0.5}, {"ttft_s": None, "router_ttft_s": 0.1},
              {"ttft_s": 9.0, "router_ttft_s": None}]
    assert prediction_error_s({"requests_detail": detail}) == 0.75
    assert prediction_error_s({"requests_detail": detail[3:]}) is None  # a peer: no header
    row = {**_row("ours", 0.7, 1.4, 600), "requests_detail": detail}
    assert table([row]).splitlines()[-1].split()[-1] == "750"


def test_verdicts_compare_within_one_repeat_and_spread_spans_the_repeats() -> None:
    rows = [{**_row("local", 1.0, 2.0, 300), "repeat": 1},
            {**_row("l3", 0.8, 1.6, 500), "repeat": 1},
            {**_row("ours", 0.7, 1.4, 600), "repeat": 1},
            {**_row("l3", 1.0, 2.0, 500), "repeat": 2},
            {**_row("ours", 0.5, 1.0, 600), "repeat": 2}]
    one, two = verdicts(rows, "local", "l3", "ours")
    assert (one["repeat"], two["repeat"]) == (1, 2)
    assert one["mean_vs_shared_l3"] == 0.7 / 0.8 and two["mean_vs_shared_l3"] == 0.5
    assert "mean_vs_local" not in two  # the local baseline ran in repeat 1 only
    [line] = spread([one, two])
    assert "mean_vs_shared_l3 0.50-0.87x (2)" in line and "mean_vs_local 0.70-0.70x (1)" in line


def test_the_demo_point_keeps_the_pressure_and_says_one_sentence() -> None:
    cfg = load_config()
    demo = demo_point(cfg, str(SAMPLE))
    point = demo.describe(cfg.local_tokens)
    assert demo.working_set >= 3 * cfg.local_tokens, point
    assert point["span_s"] == cfg.demo.duration_s and 0 < point["requests"] < 109
    rows = [_row("l3", 1.0, 2.0, 500), _row("ours", 0.7, 1.4, 600)]
    text = demo_sentence(rows, "l3", "ours", point)
    assert "0.70x the mean and 0.70x the p90" in text and "60% of prompt tokens" in text
    assert "ahead on both" in text and "NOT" not in text
    assert "NOT ahead" in demo_sentence([rows[0], _row("ours", 0.7, 2.2, 600)], "l3", "ours",
                                        point)
    assert "not measured (ours failed)" in demo_sentence(rows[:1], "l3", "ours", point)
    # one run says "ahead" only beyond the demo's run-to-run spread
    close = demo_sentence([rows[0], _row("ours", 0.95, 1.9, 600)], "l3", "ours", point)
    assert "NOT ahead: within the run-to-run spread" in close


def test_make_demos_pair_are_contenders() -> None:
    assert set(pressure_bench.DEMO_PAIR) <= {c.name for c in pressure_bench.CONTENDERS}
