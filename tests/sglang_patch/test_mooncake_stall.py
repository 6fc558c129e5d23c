"""``bound_stalls``: the Mooncake transport's deadlines set from ``pool_read_stall_s`` unless
the operator set them (the real effect, on a real store: ``test_mooncake_pool.py``)."""

from __future__ import annotations

import pytest

from sglang_patch.pool.base import PoolError
from sglang_patch.pool.mooncake_stall import STALL_ENV, bound_stalls
from sglang_patch.pool.opening import open_pool


def test_both_deadlines_are_set_in_whole_seconds() -> None:
    env: dict[str, str] = {"OTHER": "x"}
    assert bound_stalls(2.5, env) == {name: 3 for name in STALL_ENV}
    assert env == {"OTHER": "x", **{name: "3" for name in STALL_ENV}}


def test_an_operators_value_wins() -> None:
    status, progress = STALL_ENV
    env = {progress: "12"}
    assert bound_stalls(5, env) == {status: 5, progress: 12}
    assert env[progress] == "12"


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf")])
def test_a_bound_that_is_no_positive_number_is_refused(seconds: float) -> None:
    env: dict[str, str] = {}
    with pytest.raises(PoolError, match="pool_read_stall_s"):
        bound_stalls(seconds, env)
    assert env == {}


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "soon"])
def test_an_operators_value_mooncake_would_ignore_is_refused(value: str) -> None:
    with pytest.raises(PoolError, match=STALL_ENV[0]):
        bound_stalls(5, {STALL_ENV[0]: value})


def test_open_pool_refuses_a_bound_that_is_no_number() -> None:
    config = {"pool": "mooncake", "mooncake_master": "127.0.0.1:1", "pool_read_stall_s": "soon"}
    with pytest.raises(PoolError, match="pool_read_stall_s must be a number"):
        open_pool(config, 4096)
