"""The dispatch gate's async face (router/cluster/dispatcher.py) under abuse (issue 35, item 4):
a cancel that comes as the request is released, and the pricing work of one pump."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_global.registration import WorkerInfo
from router.cluster.dispatcher import Dispatcher, HeldQueueFull, Priced
from router.cluster.registry import Source
from router.config import RouterConfig
from router.state import RouterState

SERVER = ("w", 0)  # the queue model's compute server of worker w's only slot


def _dispatcher(**options: Any) -> Dispatcher:
    state = RouterState(RouterConfig.from_options(policy="least_load", dispatch="fifo",
                                                  dispatch_depth=1, profile_max_tokens=0,
                                                  **options))
    state.registry.add(WorkerInfo(worker_id="w", url="http://w.test", model="m",
                                  namespace="m@1", page_size=4), Source.REGISTERED, 0.0)
    assert state.dispatcher is not None
    assert state.routing.cost.queue.server(SERVER) == SERVER
    return state.dispatcher


def _busy(d: Dispatcher) -> None:
    """The server's only room is taken by a request without a first token."""
    d.gate.hold("busy", "m", 1.0, now=0.0, server=SERVER)
    assert d.gate.release({"m": {SERVER}}, now=0.0) == ["busy"]
    d.gate.placed("busy", SERVER)


def test_a_cancel_that_comes_as_the_request_is_released_is_not_lost() -> None:
    """The client leaves in the same turn as the pump releases its request: the wait raises
    CancelledError (``asyncio.wait_for`` of Python 3.11 returned normally here, and the dead
    request was routed), and the room it was released to is free again for the next one."""
    async def go() -> None:
        d = _dispatcher()
        _busy(d)
        waiter = asyncio.create_task(d.wait("gone", "m", Priced(0.1, SERVER), 30.0))
        await asyncio.sleep(0.01)
        assert d.gate.held() == 1
        d.gate.first_token("busy")
        d.pump()  # resolves the held request's future ...
        waiter.cancel()  # ... and its client leaves before the task runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert d.gate.held() == 0 and not d.gate._unplaced
        next_one = asyncio.create_task(d.wait("next", "m", Priced(0.1, SERVER), 30.0))
        assert await asyncio.wait_for(next_one, 5) == 0.0  # the room was freed

    asyncio.run(go())


def test_a_pump_prices_a_bounded_number_of_held_requests_stalest_first() -> None:
    """With 200 held, each pump asks the policy again for at most ``REPRICE_PER_PUMP`` of them,
    the ones priced longest ago: a pump per release that priced all of them made a mass
    disconnect quadratic. Over enough pumps every held request is priced again."""
    async def go() -> None:
        d = _dispatcher()
        _busy(d)
        priced: list[str] = []
        waiters = []
        for i in range(200):
            def reprice(i: int = i) -> Priced | None:
                priced.append(f"r{i}")
                return None
            waiters.append(asyncio.create_task(
                d.wait(f"r{i}", "m", Priced(1.0, SERVER), 30.0, reprice=reprice)))
        await asyncio.sleep(0.01)
        assert d.gate.held() == 200 and priced == []  # no room: nobody priced
        d.gate.first_token("busy")  # room for one
        d.pump()
        assert 0 < len(priced) <= Dispatcher.REPRICE_PER_PUMP
        assert d.gate.held() == 199  # and one was released
        for _ in range(200 // Dispatcher.REPRICE_PER_PUMP):
            for released in list(d.gate._unplaced):
                d.gate.drop(released)  # its prefill is done: room again
            d.pump()
        assert {f"r{i}" for i in range(200)} - set(priced) <= {"r0"}  # every held one, in turn
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)

    asyncio.run(go())


def test_the_held_queue_is_bounded_by_count_and_bytes() -> None:
    async def go() -> None:
        d = _dispatcher(dispatch_max_held=3, dispatch_max_held_bytes=1000)
        _busy(d)
        waiters = [asyncio.create_task(d.wait(f"r{i}", "m", Priced(1.0, SERVER), 30.0,
                                              size_bytes=300)) for i in range(3)]
        await asyncio.sleep(0.01)
        assert d.gate.held() == 3 and d.held_bytes == 900
        with pytest.raises(HeldQueueFull, match="3 requests held") as full:
            await d.wait("r3", "m", Priced(1.0, SERVER), 30.0)
        assert full.value.retry_after_s >= 1.0
        waiters[0].cancel()
        await asyncio.gather(waiters[0], return_exceptions=True)
        assert d.held_bytes == 600
        with pytest.raises(HeldQueueFull, match="bytes held"):
            await d.wait("r4", "m", Priced(1.0, SERVER), 30.0, size_bytes=500)
        assert d.gate.held() == 2 and d.held_bytes == 600  # a refused one leaves no trace
        # one released at once is never refused, however full the queue: here a model with
        # no server of its own (routing answers it)
        assert await d.wait("elsewhere", "other", Priced(1.0, None), 30.0,
                            size_bytes=5000) == 0.0
        for w in waiters[1:]:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert d.held_bytes == 0

    asyncio.run(go())


# Ops on a dispatcher with one busy server: a new held request (its body size), a client that
# leaves (the i-th waiter), room made (a first token of a placed one), a pump, a turn of the loop.
_op = st.one_of(st.tuples(st.just("hold"), st.integers(0, 400)),
                st.tuples(st.just("leave"), st.integers(0, 40)),
                st.tuples(st.just("room"), st.integers(0, 40)),
                st.tuples(st.just("pump"), st.just(0)),
                st.tuples(st.just("turn"), st.just(0)))


@settings(max_examples=200, deadline=None)
@given(st.lists(_op, max_size=60), st.booleans())
def test_no_client_that_left_is_ever_released_to_its_caller(ops, leave_in_the_same_turn):
    """Whatever the interleaving of holds, departures, room and pumps (a departure in the same
    turn as a pump included): a waiter whose client left never returns as released, the bounds
    hold, and once everyone is gone nothing is held, unplaced or counted in bytes."""
    async def go() -> None:
        d = _dispatcher(dispatch_max_held=8, dispatch_max_held_bytes=1500)
        _busy(d)
        waiters: list[asyncio.Task[float]] = []
        left: set[int] = set()
        placed: list[str] = []
        for name, arg in ops:
            if name == "hold":
                i = len(waiters)
                waiters.append(asyncio.create_task(d.wait(
                    f"r{i}", "m", Priced(0.1 + arg / 1000, SERVER), 30.0, size_bytes=arg)))
            elif name == "leave" and waiters:
                i = arg % len(waiters)
                if leave_in_the_same_turn:
                    d.pump()
                if not waiters[i].done():  # one already released (or refused) did not leave
                    waiters[i].cancel()
                    left.add(i)
            elif name == "room":
                for rid in list(d.gate._unplaced):  # released ones are routed
                    d.gate.placed(rid, SERVER)
                    placed.append(rid)
                if placed:
                    d.gate.first_token(placed.pop(arg % len(placed)))
                elif d.gate.in_flight(SERVER):
                    d.gate.first_token("busy")
            elif name == "pump":
                d.pump()
            else:
                await asyncio.sleep(0)
            assert d.gate.held() <= 8 and d.held_bytes <= 1500
        await asyncio.sleep(0)
        for i, w in enumerate(waiters):
            if i not in left:
                w.cancel()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        for i in left:
            assert isinstance(results[i], asyncio.CancelledError), \
                f"r{i} left while held, yet its wait returned {results[i]!r}"
        assert d.gate.held() == 0 and d.held_bytes == 0
        assert not d._waiters and not d._reprice and not d._bytes

    asyncio.run(go())
