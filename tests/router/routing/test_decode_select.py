"""router/routing/decode_select.py: headroom, batch, TBT, reservations."""

from __future__ import annotations

import pytest

from radix_global.types import Namespace, Role, WorkerId
from router.routing.contract import RouteRequest, WorkerState
from router.routing.decode_select import DecodeConfig, DecodeSelector

NS = Namespace("m@1")
D0, D1 = WorkerId("d0"), WorkerId("d1")


def dec(wid: WorkerId, **kw: object) -> WorkerState:
    return WorkerState(wid, NS, role=Role.DECODE, **kw)  # type: ignore[arg-type]


def req(i: int, tokens: int = 100, out: int | None = 100) -> RouteRequest:
    return RouteRequest(f"r{i}", NS, tokens, [], 16, output_tokens_hint=out)


def test_reservations_count_against_headroom_until_released() -> None:
    sel = DecodeSelector()
    ws = [dec(D0, kv_headroom_tokens=450)]
    picks = []
    for i in range(3):
        c = sel.choose(req(i), ws, None)
        picks.append(c.reason or c.worker_id)
        if c.accepted:
            sel.reserve(f"r{i}", (D0, 0), c.reserve_tokens)
    assert picks == ["d0", "d0", "decode_kv"]  # 2 x 200 fit in 450, a third does not
    assert sel.release("r0") and not sel.release("r0")
    assert sel.choose(req(3), ws, None).accepted


def test_other_routers_reservations_count_against_headroom() -> None:
    sel = DecodeSelector()
    assert sel.choose(req(0), [dec(D0, kv_headroom_tokens=450)], None).accepted
    shared = dec(D0, kv_headroom_tokens=450, peer_decode_tokens=300)
    assert sel.choose(req(0), [shared], None).reason == "decode_kv"  # 200 more do not fit


def test_lowest_predicted_tbt_then_most_headroom() -> None:
    sel = DecodeSelector(DecodeConfig(tbt_base_s=0.01, tbt_per_request_s=0.001))
    ws = [dec(D0, running=5, kv_headroom_tokens=10**6), dec(D1, running=1, kv_headroom_tokens=1000)]
    c = sel.choose(req(0), ws, 0.1)
    assert c.worker_id == D1 and c.predicted_tbt_s == pytest.approx(0.012)
    even = [dec(D0, running=1, kv_headroom_tokens=2000), dec(D1, running=1, kv_headroom_tokens=900)]
    assert sel.choose(req(0), even, None).worker_id == D0


def test_tbt_slo_and_default_output_length() -> None:
    sel = DecodeSelector(DecodeConfig(tbt_base_s=0.02, tbt_per_request_s=0.01,
                                      default_output_tokens=50))
    busy = [dec(D0, running=9)]
    c = sel.choose(req(0), busy, 0.05)
    assert not c.accepted and c.reason == "tbt_slo" and c.predicted_tbt_s == pytest.approx(0.12)
    assert sel.needed_tokens(req(0, tokens=10, out=None)) == 60
    assert sel.choose(req(0), [], None).reason == "no_workers"
    assert sel.choose(req(0), [dec(D0, accepting=False)], None).reason == "no_workers"


def test_forgetting_a_worker_drops_its_reservations() -> None:
    sel = DecodeSelector()
    sel.reserve("a", (D0, 0), 10)
    sel.reserve("b", (D1, 0), 10)
    sel.forget_worker(D0)
    assert sel.reserved_tokens((D0, 0)) == 0 and sel.reserved_tokens((D1, 0)) == 10
