from __future__ import annotations

from pathlib import Path

import pytest

from radix_global_tools.plan.costs import CostFileError, CostWeights, load_costs
from radix_global_tools.plan.sizing import Sizing


def test_defaults_and_a_partial_file(tmp_path: Path) -> None:
    assert load_costs() == CostWeights()
    f = tmp_path / "c.toml"
    f.write_text("[cost]\npool_gib = 1\n")
    assert load_costs(f) == CostWeights(pool_gib=1.0)


@pytest.mark.parametrize("body, match", [
    ("[cost]\nnodes = 1\n", "unknown cost 'nodes'"),
    ("[cost]\npool_gib = -1\n", "must be a number >= 0"),
    ("[cost]\npool_gib = true\n", "must be a number >= 0"),
    ("pool_gib = 1\n", r"missing table \[cost\]"),
    ("[cost\n", "cannot read"),
])
def test_bad_files(tmp_path: Path, body: str, match: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(body)
    with pytest.raises(CostFileError, match=match):
        load_costs(f)


def test_cost_of_a_cluster() -> None:
    w = CostWeights(prefill_instance=10, decode_instance=5, pool_gib=1, host_gib=2,
                    bandwidth_gbit=0.5)
    s = Sizing(prefill=2, decode=3, pool_tokens=2**30 // 1024, bandwidth_Bps=1e9 / 8)
    # the host cache: the profile's where the sizing leaves it, else the sizing's
    gib = 2**30 // 1024
    assert w.of(s, kv_bytes_per_token=1024, host_tokens=gib // 2) == pytest.approx(
        20 + 15 + 2 * 2 * 0.5 + 1 + 0.5 * 5)
    assert w.of(s._replace(host_tokens=gib), kv_bytes_per_token=1024,
                host_tokens=gib // 2) == pytest.approx(20 + 15 + 2 * 2 * 1 + 1 + 0.5 * 5)
    # the device's part of an instance's own cache is paid with the instance
    assert w.of(s._replace(host_tokens=gib), kv_bytes_per_token=1024, host_tokens=0,
                device_tokens=gib // 4) == pytest.approx(20 + 15 + 2 * 2 * 0.75 + 1 + 0.5 * 5)
