"""peer_check's verdict from what the engines answered (the check itself runs on real engines:
``python -m benchmarks.scenarios.peer_check``)."""

from __future__ import annotations

import pytest

from benchmarks.scenarios.peer_check import MODES, NEGATIVE, ROUTERS, Turn, judge, main

FIRST = 1024


def turns(second_cached: list[int | None]) -> list[Turn]:
    firsts = [Turn(i, 1, FIRST, 0) for i in range(len(second_cached))]
    return firsts + [Turn(i, 2, FIRST + 256, c) for i, c in enumerate(second_cached)]


def test_every_history_found_on_both_engines_passes() -> None:
    probes = [[1008, 0], [0, 1008], [1008, 0]]
    row = judge(turns([1008, 1008, 1024]), probes, FIRST)
    assert row["verdict"] == "pass" and row["holders"] == [[0], [1], [0]]


def test_round_robin_misses_fail() -> None:
    # An odd count in order: each second turn lands on the other engine and finds nothing.
    probes = [[1008, 0], [0, 1008], [1008, 0]]
    assert judge(turns([0, 0, 0]), probes, FIRST)["verdict"] == "fail"
    assert judge(turns([1008, 1008, 16]), probes, FIRST)["verdict"] == "fail"  # one page: not it


def test_one_engine_holding_everything_proves_nothing() -> None:
    row = judge(turns([1008] * 3), [[1008, 0]] * 3, FIRST)
    assert row["verdict"] == "not shown"


def test_a_failed_request_or_probe_is_an_error_not_a_miss() -> None:
    probes = [[1008, 0], [0, 1008], [1008, 0]]
    assert judge(turns([1008, None, 1008]), probes, FIRST)["verdict"] == "error"
    assert judge(turns([1008] * 3), [[1008, None], [0, 1008], [1008, 0]],
                 FIRST)["verdict"] == "error"


def test_every_cache_aware_mode_of_the_bench_and_a_control_per_engine_kind() -> None:
    assert {"sglang-router cache_aware", "smg cache_aware tree", "smg cache_aware hash",
            "smg prefix_hash", "smg cache_aware event index",
            "ours conductor (pool off)"} == set(MODES)
    assert MODES["smg cache_aware event index"].engines == "grpc"
    assert MODES["smg cache_aware hash"].token_ids  # as pressure_bench sends it
    assert {c.engines for c in NEGATIVE.values()} == {"http", "grpc"}
    assert all(c.router.policy == "round_robin" for c in NEGATIVE.values())
    assert set(ROUTERS) == set(MODES) | set(NEGATIVE)


def test_an_even_count_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--conversations", "4"])
