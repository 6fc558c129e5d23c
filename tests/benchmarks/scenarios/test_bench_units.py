"""The side-by-side bench's pure parts: contender order, verdict, table, plan, command lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scenarios import bench, bench_report
from radix_global_tools.cluster.local import EngineSet, RouterSpec, engine_argv, router_argv


def test_headline_runs_first_within_each_engine_kind() -> None:
    ordered = bench.order(list(reversed(bench.ALL)))
    kinds = [c.engines for c in ordered]
    assert kinds == sorted(kinds, key=["stock", "ours"].index)
    assert ordered[0] == bench.HEADLINE[0]
    assert ordered[kinds.index("ours")] == bench.HEADLINE[1]
    assert len({c.name for c in bench.ALL}) == len(bench.ALL) == 12


def _row(name: str, mean: float, p90: float) -> dict[str, object]:
    return {"contender": name, "ttft_mean_s": mean, "ttft_p90_s": p90}


def test_verdict_needs_both_mean_and_p90() -> None:
    base, ours = bench.HEADLINE[0].name, bench.HEADLINE[1].name
    win = bench.verdict([_row(base, 2.0, 4.0), _row(ours, 1.0, 3.0)])
    assert win["beats_mean"] and win["beats_p90"] and "beats sglang-router" in win["text"]
    half = bench.verdict([_row(base, 2.0, 4.0), _row(ours, 1.0, 5.0)])
    assert half["beats_mean"] and not half["beats_p90"] and "does NOT beat" in half["text"]
    missing = bench.verdict([_row(base, 2.0, 4.0), {"contender": ours, "skipped": "x"}])
    assert missing["beats_mean"] is None


def test_table_formats_and_marks_skipped() -> None:
    text = bench_report.table([
        {"contender": "a", "requests": 3, "ok": 3, "rejected": 0, "failed": 0,
         "ttft_mean_s": 0.25, "slo_attainment": 0.5, "bytes_moved": 2_000_000},
        {"contender": "b", "skipped": "time budget spent"}])
    lines = text.splitlines()
    assert lines[0].startswith("contender") and set(lines[1]) == {"-"}
    assert "250" in lines[2] and "50%" in lines[2] and "2.0" in lines[2]
    assert "skipped: time budget spent" in lines[3]


def test_cdf_plot_and_json(tmp_path: Path) -> None:
    png = bench_report.cdf_plot({"x": [0.1, 0.3, 0.2], "y": []}, tmp_path / "c.png", "t")
    assert png is not None and png.stat().st_size > 1000
    assert bench_report.cdf_plot({"y": []}, tmp_path / "d.png", "t") is None
    out = bench_report.write_json(tmp_path / "r" / "x.json", {"a": 1})
    assert json.loads(out.read_text()) == {"a": 1}


def test_quick_config_is_the_headline_on_a_short_plan() -> None:
    args = bench.build_parser().parse_args(["--quick", "--trace", str(bench.SAMPLE_TRACE)])
    cfg = bench.config_from_args(args)
    assert cfg.contenders == tuple(c.name for c in bench.HEADLINE)
    plan, scaling = bench.build_plan(cfg)
    mean_prompt = sum(len(p.input_ids) for p in plan) / len(plan)
    assert 1024 <= mean_prompt <= 4096
    assert plan[-1].send_at_s == pytest.approx(cfg.duration_s)
    assert scaling.tokens_per_hash_id % cfg.page_size == 0


def test_unknown_contender_is_refused() -> None:
    args = bench.build_parser().parse_args(["--contenders", "nope"])
    with pytest.raises(SystemExit, match="unknown contender"):
        bench.config_from_args(args)


def test_command_lines() -> None:
    ours = engine_argv(EngineSet("ours", "/m"), 1234, 0, "http://127.0.0.1:9", "pool-x")
    assert ours[1:4] == ["-m", "radix_global_cli", "sglang"]
    assert ours[ours.index("--radix-global") + 1] == "http://127.0.0.1:9"
    assert ours[ours.index("--radix-global-pool-id") + 1] == "pool-x"
    stock = engine_argv(EngineSet("stock", "/m"), 1234, 0, None, None)
    assert "--radix-global" not in stock and "--kv-events-config" in stock
    assert "--enable-hierarchical-cache" not in stock
    sgr = router_argv(RouterSpec("sglang-router", "cache_aware"), 5, ["http://a"], "/m")
    assert sgr[1:3] == ["-m", "sglang_router.launch_router"]
    assert sgr[sgr.index("--policy") + 1] == "cache_aware"
    assert sgr[sgr.index("--prometheus-host") + 1] == "127.0.0.1"  # never on every interface
    smg = router_argv(RouterSpec("smg", "cache_aware"), 5, ["http://a"], "/m")
    assert smg[1:3] == ["-m", "smg.launch_router"]  # not the `smg` script sglang-router shadows
    assert smg[smg.index("--prometheus-host") + 1] == "127.0.0.1"
    rg = router_argv(RouterSpec("ours", "conductor"), 5, [], "/m")
    assert "--workers" not in rg and rg[rg.index("--model-path") + 1] == "/m"
    with pytest.raises(ValueError):
        EngineSet("stock", "/m", n=4)


def test_engines_are_pinned_one_core_each_round_robin() -> None:
    import os

    cores = sorted(os.sched_getaffinity(0))
    spec = EngineSet("stock", "/m", n=3)
    assert [spec.cores(i) for i in range(3)] == [{cores[i % len(cores)]} for i in range(3)]
    assert EngineSet("stock", "/m", pin_cores=False).cores(0) is None


def test_clear_pool_empties_the_engines_pool() -> None:
    import uuid

    import numpy as np

    from benchmarks.scenarios.bench import clear_pool
    from radix_global_tools.cluster.local import Engines
    from sglang_patch.pool.shm_pool import ShmPagePool, destroy_pool

    spec = EngineSet("ours", "/m")
    pool_id = f"test-clear-{uuid.uuid4().hex[:8]}"
    assert clear_pool(Engines(spec, [], pool_id)) == 0  # not created yet: nothing to clear
    pool = ShmPagePool(pool_id, 64, 4 * 64, spec.pool_root)
    try:
        for i in range(3):
            pool.put(f"ns@1/k{i}", [np.full(64, i, np.uint8)], tag=i)
        assert clear_pool(Engines(spec, [], pool_id)) == 3
        assert pool.stats().pages == 0
    finally:
        pool.close()
        destroy_pool(pool_id, spec.pool_root)
