"""``radix-global simulate`` end to end on the shipped trace sample (short: 60 requests)."""

from __future__ import annotations

import json
from pathlib import Path

from radix_global_tools.simulate.main import main

SAMPLE = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "conversation_sample.jsonl"


def test_cli_writes_json_and_plot(tmp_path: Path) -> None:
    rc = main([str(SAMPLE), "--limit", "60", "--loads", "1,4", "--instances", "4",
               "--scale-instances", "16,32", "--experiments", "fig5,fig10,admission,scale",
               "--out", str(tmp_path), "--tag", "t"])
    assert rc == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["requests"] == 60
    rows = data["fig5"]["by_policy"]["global_cache_aware"]
    assert [r["load"] for r in rows] == [1.0, 4.0]
    assert rows[1]["mean_ttft_s"] >= rows[0]["mean_ttft_s"]  # more load never helps
    assert [r["instances"] for r in data["scale"]] == [16, 32]
    assert data["scale"][1]["index_memory_bytes"] > data["scale"][0]["index_memory_bytes"] > 0
    assert (tmp_path / "t_fig5_ttft_vs_load.png").stat().st_size > 1000


def test_cli_refuses_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main([str(bad), "--out", str(tmp_path)]) == 2
    assert main([str(SAMPLE), "--experiments", "nope", "--out", str(tmp_path)]) == 2
