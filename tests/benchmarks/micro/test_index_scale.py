"""The index scale benchmark runs end to end at a small size (so it does not rot)."""

from __future__ import annotations

from benchmarks.micro.index_scale import one_size


def test_a_small_size_is_built_matched_and_restored() -> None:
    row = one_size(pages=3000, workers=8, prefixes=4, matches=40, seed=0)
    assert row["pages"] >= 3000 and row["prompts"] * 48 >= 3000 - 4 * 16
    assert 0 < row["match_us_p50"] <= row["match_us_p99"]
    assert row["snapshot_mib"] > 0 and row["restore_s"] >= 0
