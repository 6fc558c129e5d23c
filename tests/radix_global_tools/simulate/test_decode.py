"""The lazy decode batch against a step-by-step brute force (hypothesis), and its edge cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_global_tools.simulate.decode import DecodeInstance, DecodeProfile

PROFILE = DecodeProfile(step_fixed_s=0.01, step_per_request_s=0.002,
                        step_per_context_token_s=1e-5, kv_tokens_per_instance=400)

Join = tuple[float, str, int, int]  # time, request, context tokens, steps


def brute_force(profile: DecodeProfile, joins: list[Join],
                stalls: list[tuple[float, float]]) -> dict[str, float]:
    """One step at a time: the finish time of every request (inf when it can never fit)."""
    joins, stalls = sorted(joins), sorted(stalls)
    waiting: list[tuple[str, int, int]] = []
    active: dict[str, list[int]] = {}  # request -> [context now, steps left, reserved]
    finish: dict[str, float] = {}
    clock, used = 0.0, 0

    def deliver() -> None:
        while joins and joins[0][0] <= clock:
            _, rid, ctx, steps = joins.pop(0)
            if ctx + steps > profile.kv_tokens_per_instance:
                finish[rid] = math.inf
            else:
                waiting.append((rid, ctx, steps))

    def admit() -> None:
        nonlocal used
        while waiting and used + sum(waiting[0][1:]) <= profile.kv_tokens_per_instance:
            rid, ctx, steps = waiting.pop(0)
            if steps == 0:
                finish[rid] = clock
            else:
                used += ctx + steps
                active[rid] = [ctx, steps, ctx + steps]

    while joins or waiting or active or stalls:
        if active:
            clock += profile.step_s(len(active), sum(v[0] for v in active.values()))
            for rid in list(active):
                active[rid][0] += 1
                active[rid][1] -= 1
                if active[rid][1] == 0:
                    used -= active.pop(rid)[2]
                    finish[rid] = clock
        elif joins and (not stalls or joins[0][0] < stalls[0][0]):
            clock = max(clock, joins[0][0])
        elif stalls:
            start, seconds = stalls.pop(0)
            clock = max(clock, start) + seconds
        deliver()
        admit()
        # a prefill that began during the step just run goes after it
        while stalls and stalls[0][0] <= clock:
            clock += stalls.pop(0)[1]
            deliver()
            admit()
    return finish


def lazy(profile: DecodeProfile, joins: list[Join],
         stalls: list[tuple[float, float]]) -> dict[str, float]:
    inst = DecodeInstance(profile)
    events = sorted([(t, 0, (t, s)) for t, s in stalls] + [(j[0], 1, j) for j in joins])
    done = []
    for _, kind, ev in events:
        if kind == 0:
            inst.stall(*ev)  # type: ignore[arg-type]
        else:
            t, rid, ctx, steps = ev  # type: ignore[misc]
            inst.join(t, rid, ctx, steps)
            done += inst.advance(t)
    done += inst.drain()
    assert len({d.request_id for d in done}) == len(done), "a request finished twice"
    return {d.request_id: d.finish_s for d in done}


joins_st = st.lists(
    st.tuples(st.floats(0, 2, allow_nan=False), st.integers(0, 300), st.integers(1, 40)),
    max_size=12)
# (gap before, duration): one prefill at a time, as a FIFO prefill queue runs them
stalls_st = st.lists(st.tuples(st.floats(0, 0.7), st.floats(0.001, 0.3)), max_size=4)


def in_sequence(gaps: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, end = [], 0.0
    for gap, seconds in gaps:
        out.append((end + gap, seconds))
        end += gap + seconds
    return out


@settings(max_examples=300, deadline=None)
@given(joins_st, stalls_st)
def test_lazy_batch_matches_step_by_step(raw: list[tuple[float, int, int]],
                                         gaps: list[tuple[float, float]]) -> None:
    stalls = in_sequence(gaps)
    joins = [(t, f"r{i}", ctx, steps) for i, (t, ctx, steps) in enumerate(raw)]
    want = brute_force(PROFILE, list(joins), list(stalls))
    got = lazy(PROFILE, joins, stalls)
    assert set(got) == set(want)
    for rid, t in want.items():
        assert got[rid] == pytest.approx(t, rel=1e-9, abs=1e-9), rid


def test_one_request_takes_its_steps() -> None:
    inst = DecodeInstance(PROFILE)
    inst.join(1.0, "a", 100, 3)
    (d,) = inst.drain()
    # contexts 100, 101, 102: three steps of one request
    want = sum(PROFILE.step_s(1, 100 + k) for k in range(3))
    assert (d.start_s, d.finish_s) == (1.0, pytest.approx(1.0 + want))


def test_a_request_too_large_for_the_instance_never_finishes() -> None:
    inst = DecodeInstance(PROFILE)
    inst.join(0.0, "big", 390, 20)
    assert inst.advance(0.0)[0].finish_s == math.inf


def test_a_request_waits_for_kv() -> None:
    inst = DecodeInstance(PROFILE)
    inst.join(0.0, "a", 300, 10)
    inst.join(0.0, "b", 150, 10)  # 310 + 160 > 400: waits for a
    assert (inst.batch, inst.queued) == (1, 1)
    a, b = inst.drain()
    assert b.start_s == a.finish_s


def test_whole_steps_within_is_exact() -> None:
    for seconds in (0.0, 0.0119, 0.012, 0.5, 3.0):
        n = PROFILE.whole_steps_within(seconds, 3, 250)
        assert PROFILE.steps_s(n, 3, 250) <= seconds < PROFILE.steps_s(n + 1, 3, 250)
