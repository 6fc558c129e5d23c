"""``radix-global plan``: its files, and a one-line error with exit 2 for bad input."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from benchmarks.harness.paths import REPO
from radix_global_tools.plan.main import main
from router.config import config_from_file

SAMPLE = str(REPO / "benchmarks" / "data" / "conversation_multiturn_sample.jsonl")


def test_writes_a_plan_the_router_reads(tmp_path: Path) -> None:
    assert main([SAMPLE, "--ttft-slo", "5", "--tbt-slo", "0.1", "--accept", "0.95",
                 "--out", str(tmp_path), "--tag", "p"]) == 0
    plan = tomllib.loads((tmp_path / "p.toml").read_text())
    assert plan["plan"]["version"] == 1 and plan["plan"]["mode"] == "pd"
    assert plan["cluster"]["prefill_instances"] >= 1 and plan["cluster"]["decode_instances"] >= 1
    assert plan["predicted"]["share_meeting_both"] >= 0.95
    assert set(plan["cache"]) == {"device_bytes", "host_bytes", "pool_bytes", "disk_bytes"}
    router = config_from_file(tmp_path / "p_router.toml")
    assert router.slo.ttft_slo_s == 5.0 and router.slo.tbt_slo_s == 0.1
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert (tmp_path / "p.json").is_file()
    # the documented example has exactly the keys a plan has
    example = tomllib.loads((REPO / "docs" / "examples" / "plan.toml").read_text())
    assert {(t, k) for t in plan for k in plan[t]} == {(t, k) for t in example for k in example[t]}


def test_copies_in_the_plan_file(tmp_path: Path) -> None:
    assert main([SAMPLE, "--ttft-slo", "5", "--tbt-slo", "0.1", "--accept", "0.95",
                 "--mode", "colocated", "--bandwidths", "700", "--copies", "0,1",
                 "--out", str(tmp_path), "--tag", "c"]) == 0
    plan = tomllib.loads((tmp_path / "c.toml").read_text())
    assert plan["cache"]["pool_copies"] in (0, 1)
    with pytest.raises(SystemExit) as exc:
        main([SAMPLE, "--ttft-slo", "5", "--tbt-slo", "0.1", "--copies", "-1"])
    assert exc.value.code == 2


def test_what_if_knobs(tmp_path: Path) -> None:
    args = [SAMPLE, "--ttft-slo", "5", "--tbt-slo", "0.1", "--accept", "0.95",
            "--out", str(tmp_path), "--bandwidths", "700"]
    assert main([*args, "--tag", "base"]) == 0
    assert main([*args, "--tag", "fast", "--prefill-speedup", "4", "--page-tokens", "1024",
                 "--kv-bytes-per-token", "163840"]) == 0
    base, fast = (tomllib.loads((tmp_path / f"{t}.toml").read_text()) for t in ("base", "fast"))
    assert fast["cluster"]["prefill_instances"] < base["cluster"]["prefill_instances"]


@pytest.mark.parametrize("extra, match", [
    (["--ttft-slo", "0.01", "--tbt-slo", "0.1"], "no cluster can meet these SLOs"),
    (["--ttft-slo", "5", "--tbt-slo", "0.1", "--accept", "2"], "--accept must be in"),
    (["--ttft-slo", "5", "--tbt-slo", "0.1", "--page-tokens", "100"], "multiple of the trace"),
    (["--ttft-slo", "5", "--tbt-slo", "0.1", "--hardware", "nope.toml"], "cannot read"),
])
def test_bad_input_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   extra: list[str], match: str) -> None:
    assert main([SAMPLE, *extra, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_not_a_mooncake_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "prompt": "hello"}\n')
    assert main([str(bad), "--ttft-slo", "5", "--tbt-slo", "0.1", "--out", str(tmp_path)]) == 2
    assert "line 1" in capsys.readouterr().err


def test_a_profile_missing_a_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "hw.toml"
    text = (REPO / "radix_global_tools" / "simulate" / "cpu_config.toml").read_text()
    profile.write_text(text.replace("step_per_request_s", "step_per_req_s"))
    assert main([SAMPLE, "--ttft-slo", "5", "--tbt-slo", "0.1", "--hardware", str(profile),
                 "--out", str(tmp_path)]) == 2
    assert "decode: missing 'step_per_request_s'" in capsys.readouterr().err
