"""A bad publisher must not stall or poison the feed (issue 12, items 8, 9, 10).

Real ZMQ on loopback with the scripted publisher of ``test_subscriber.py``: a poison message is a
counted refusal that still advances the sequence (no false gap, no replay loop); a seq that goes
backwards is a restarted publisher (resync), an out-of-range seq is refused; a worker whose
endpoint cannot be subscribed fails alone (timeouts of the others go on, removal never raises).
A replay that answers garbage for the batches it replays (issue 35, item 12) loses them: they are
counted (``replay_lost``) and the worker resyncs, as for an unrecoverable gap; a replayed batch
that decodes but whose events are refused is no loss.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import zmq
import zmq.asyncio
from test_subscriber import TOPIC, A, B, Clock, ScriptedPublisher, held, info, stored, until

from radix_global import keys
from radix_global.events import EventDecoder
from radix_global.index import GlobalIndex
from radix_global.registration import WorkerInfo
from radix_global.subscriber import KVEventSubscriber
from radix_global.types import Namespace, WorkerId

pytestmark = pytest.mark.timeout(30)
PS = 4
NS = Namespace("m@1")
DEEP = b"\x91" * 200_000 + b"\xc0"  # 200k nested one-element arrays: RecursionError in msgspec


@pytest_asyncio.fixture
async def feed() -> AsyncIterator[tuple[Any, GlobalIndex, KVEventSubscriber, Clock]]:
    ctx = zmq.asyncio.Context()
    index, clock = GlobalIndex(), Clock()
    sub = KVEventSubscriber(index, clock=clock, timeout_s=20.0, replay_timeout_s=0.5, context=ctx)
    try:
        yield ctx, index, sub, clock
    finally:
        await sub.close()
        ctx.destroy(linger=0)


async def send_raw(pub: ScriptedPublisher, payload: bytes, seq: int | None = None) -> int:
    """Publish (and buffer for replay) a payload that is not a well-formed batch."""
    seq = len(pub.buffer) if seq is None else seq
    pub.buffer.append((seq, payload))
    await pub.pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])
    return seq


def unsafe_info(base: WorkerInfo, **fields: Any) -> WorkerInfo:
    """A record registration would refuse (as one restored from an older build could be)."""
    bad = msgspec.structs.replace(base)
    for name, value in fields.items():
        msgspec.structs.force_setattr(bad, name, value)
    return bad


@pytest.mark.asyncio
@pytest.mark.parametrize("replay", [True, False], ids=["replay", "no_replay"])
async def test_poison_message_is_refused_and_advances_the_seq(feed: Any, replay: bool) -> None:
    ctx, index, sub, _ = feed
    pub = ScriptedPublisher(ctx, replay=replay)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])  # seq 0
        await until(lambda: held(index, A) == 4)
        await send_raw(pub, DEEP)  # seq 1
        await pub.send([stored(B)])  # seq 2: must not look like a gap
        await until(lambda: held(index, B) == 2)
        assert held(index, A) == 4, "a poison message must not drop the worker's entries"
        s = sub.stats()
        assert (s.gaps, s.resyncs) == (0, 0)
        assert s.refused == {"malformed": 1}
        await pub.send([stored(A[:8])])  # and the feed goes on
        await until(lambda: sub.stats().batches == 4)
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_poison_in_a_replay_is_lost_once_not_looped(feed: Any) -> None:
    """The live copy was missed and the replay's does not decode: the batch is lost (counted,
    resynced: issue 35), once; the live stream goes on without a second gap or replay."""
    ctx, index, sub, _ = feed
    pub = ScriptedPublisher(ctx)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])  # seq 0
        await until(lambda: held(index, A) == 4)
        pub.buffer.append((1, DEEP))  # seq 1: lost live, only the replay has it
        await pub.send([stored(B)])  # seq 2: a gap, replayed from seq 1
        await until(lambda: held(index, B) == 2)
        await pub.send([stored(A[:8])])  # seq 3: no second gap, no second replay
        await until(lambda: held(index, A) == 2)
        s = sub.stats()
        assert (s.gaps, s.resyncs, s.replay_failures, s.replay_lost) == (1, 1, 1, 1)
        assert pub.requests == [0, 1] and s.refused == {"malformed": 1}
    finally:
        pub.close()


GARBAGE = b"\xc1 not msgpack"  # 0xc1 is never used by msgpack


@pytest.mark.asyncio
async def test_garbage_replayed_for_a_gap_is_counted_lost_and_resyncs(feed: Any) -> None:
    ctx, index, sub, _ = feed
    pub = ScriptedPublisher(ctx)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])  # seq 0
        await until(lambda: held(index, A) == 4)
        for _ in range(3):
            await pub.send([stored(B)], drop=True)  # seq 1..3: missed live
        pub.buffer[1:4] = [(s, GARBAGE) for s in (1, 2, 3)]  # and the replay answers garbage
        await pub.send([stored(A[:8])])  # seq 4: a gap
        await until(lambda: sub.stats().batches >= 5)
        s = sub.stats()
        assert (s.gaps, s.replay_lost, s.replay_failures, s.resyncs) == (1, 3, 1, 1)
        assert held(index, A) == 2, "entries dropped (resync), then seq 4 applied"
        assert pub.requests == [0, 1]
        await pub.send([stored(B)])  # seq 5: the feed goes on, no further gap
        await until(lambda: held(index, B) == 2)
        assert sub.stats().gaps == 1
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_garbage_in_the_join_catch_up_is_counted_lost_and_resyncs(feed: Any) -> None:
    ctx, index, sub, _ = feed
    pub = ScriptedPublisher(ctx)
    try:
        await pub.send([stored(A)], drop=True)  # seq 0, before we joined
        pub.buffer += [(1, GARBAGE), (2, GARBAGE)]
        await pub.send([stored(B)], drop=True)  # seq 3
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await until(lambda: sub.stats().batches >= 4)  # the catch-up: seqs 0..3
        await pub.send([stored(A[:8])])  # seq 4: continues the replayed stream
        await until(lambda: held(index, A) == 2)
        s = sub.stats()
        assert (s.gaps, s.replay_lost, s.replay_failures, s.resyncs) == (0, 2, 1, 1)
        assert held(index, B) == 0, "what the catch-up applied around the garbage is dropped"
    finally:
        pub.close()


# A batch that decodes but whose only event is refused (a type we do not know): read, not lost.
UNKNOWN_ONLY = msgspec.msgpack.encode([1.0, [{"type": "BlockTeleported"}], 0])


@pytest.mark.asyncio
@pytest.mark.parametrize(("payload", "lost"), [(UNKNOWN_ONLY, False), (GARBAGE, True)],
                         ids=["unknown_event_only", "undecodable"])
async def test_replay_lost_only_when_the_payload_itself_does_not_decode(
        feed: Any, payload: bytes, lost: bool) -> None:
    """``replay_lost`` is ``DecodedBatch.unreadable``, not "no ops and a malformed refusal": a
    replayed batch whose one event is of an unknown type is a counted refusal, as live, and
    keeps the worker's entries; a payload that is no batch is lost and resyncs."""
    ctx, index, sub, _ = feed
    pub = ScriptedPublisher(ctx)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])  # seq 0
        await until(lambda: held(index, A) == 4)
        pub.buffer.append((1, payload))  # seq 1: missed live, only the replay has it
        await pub.send([stored(B)])  # seq 2: a gap, replayed from seq 1
        await until(lambda: held(index, B) == 2)
        s = sub.stats()
        assert s.refused == {"malformed": 1} and pub.requests == [0, 1]
        assert (s.gaps, s.replay_lost, s.resyncs, s.replay_failures) == (
            (1, 1, 1, 1) if lost else (1, 0, 0, 0))
        assert held(index, A) == (0 if lost else 4)
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_restart_whose_seq_0_was_missed_resyncs(feed: Any) -> None:
    ctx, index, sub, _ = feed
    pub = ScriptedPublisher(ctx, replay=False)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        for _ in range(3):
            await pub.send([stored(A)])  # seq 0..2
        await until(lambda: sub.stats().batches == 3)
        # The engine restarted (empty cache); its seq 0 never reached us.
        await pub.send([stored(B)], seq=1)
        await until(lambda: held(index, B) == 2)
        assert held(index, A) == 0, "the old engine's pages are gone"
        s = sub.stats()
        assert (s.resyncs, s.restarts, s.duplicates) == (1, 1, 0)
        await pub.send([stored(A)], seq=2)  # the new stream goes on
        await until(lambda: held(index, A) == 4)
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_restart_replays_the_new_streams_history(feed: Any) -> None:
    ctx, index, sub, _ = feed
    pub = ScriptedPublisher(ctx)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        for _ in range(3):
            await pub.send([stored(B)])
        await until(lambda: sub.stats().batches >= 3)
        pub.buffer = []  # restarted: a new buffer
        await pub.send([stored(A[:8])], drop=True)  # new seq 0, missed
        await pub.send([stored(A[8:], parent=keys.page_keys(A, PS)[1], full=A)])  # seq 1
        await until(lambda: held(index, A) == 4)  # seq 0 came from the replay
        assert held(index, B) == 0 and sub.stats().restarts == 1
    finally:
        pub.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("bad_seq", [2**64 - 1, 2**63])
async def test_out_of_range_seq_is_refused_not_adopted(feed: Any, bad_seq: int) -> None:
    ctx, index, sub, _ = feed
    pub = ScriptedPublisher(ctx, replay=False)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])  # seq 0
        await until(lambda: held(index, A) == 4)
        await pub.send([stored(A[:8])], seq=bad_seq)
        await pub.send([stored(B)], seq=1)
        await until(lambda: held(index, B) == 2)
        s = sub.stats()
        assert held(index, A) == 4 and (s.gaps, s.resyncs, s.duplicates) == (0, 0, 0)
        assert s.refused == {"bad_seq": 1}
    finally:
        pub.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("endpoint", ["tcp://*:5557", "garbage", "tcp://127.0.0.1:notaport"])
async def test_unsubscribable_worker_fails_alone(feed: Any, endpoint: str) -> None:
    ctx, index, sub, clock = feed
    pub = ScriptedPublisher(ctx, replay=False)
    try:
        good = info(pub, "good")
        bad = unsafe_info(info(pub, "bad", dp_size=2), kv_events_endpoint=endpoint,
                          kv_events_replay_endpoint=endpoint)
        assert await sub.add_worker(bad) is False  # registered, but nothing followed
        assert await sub.add_worker(good) is True
        await pub.wait_subscribed()
        await pub.send([stored(A)])
        await until(lambda: held(index, A, "good") == 4)
        assert sub.stats().subscribe_failures == 2  # both ranks
        clock.t += 25
        assert set(await sub.check_timeouts()) == {WorkerId("good"), WorkerId("bad")}
        assert held(index, A, "good") == 0 and sub.workers() == []
        assert await sub.add_worker(bad) is False
        assert await sub.remove_worker(WorkerId("bad")) is True  # never re-raises
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_watch_survives_a_failing_removal(feed: Any) -> None:
    _, _, sub, clock = feed
    calls: list[WorkerId] = []

    def on_timeout(wid: WorkerId) -> None:
        calls.append(wid)
        raise RuntimeError("callback bug")

    sub._on_timeout = on_timeout
    for wid in ("w1", "w2"):
        await sub.add_worker(WorkerInfo(worker_id=wid, url="http://127.0.0.1:1", model="m",
                                        namespace="m@1", page_size=PS))
    clock.t += 25
    watcher = asyncio.create_task(sub.watch(0.01))
    try:
        await until(lambda: len(calls) == 2)
        assert not watcher.done()
    finally:
        watcher.cancel()


# ---- the decoder alone (pure) ---------------------------------------------------------------
def _decoder(**kw: Any) -> EventDecoder:
    return EventDecoder(WorkerId("w0"), NS, PS, **kw)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


GOOD = msgspec.msgpack.encode([1.0, [stored(A)], 0])


@pytest.mark.parametrize("payload", [
    DEEP,
    msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [0] * PS, PS, None, [[[]]] * 3]], 0]),
    msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1],
                                   "token_ids": [-1] * PS, "block_size": PS,
                                   "cache_salt": "s"}], 0]),  # negative token: not re-keyable
    msgspec.msgpack.encode([1.0, [["BlockRemoved", [1], b"\xff" * 10]], 0]),
    msgspec.msgpack.encode([1.0, [{"type": _nested(900)}], 0]),
    msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [1],
                                   "medium": "x" * 1_000_000}], 0]),
], ids=["deep_batch", "list_medium", "negative_token", "bytes_medium", "nested_tag", "huge_medium"])
def test_decode_never_raises(payload: bytes) -> None:
    d = _decoder()
    out = d.decode(payload)
    assert out.ops == [] and sum(d.refused.values()) == 1
    assert len(str(out.refusals[0])) < 500, "a refusal's message (it is logged) stays short"
    assert d.decode(GOOD).ops, "a valid batch afterwards still decodes"


def test_dp_rank_outside_the_workers_ranks_is_refused() -> None:
    d = _decoder(dp_size=2)
    for rank in (2, 2**32, 2**63):
        assert d.decode(msgspec.msgpack.encode([1.0, [stored(A)], rank])).ops == []
    assert d.refused == {"malformed": 3}
    assert d.decode(msgspec.msgpack.encode([1.0, [stored(A)], 1])).ops[0].location.dp_rank == 1
    # Without a known dp size a rank still has to fit the wire's uint32.
    assert _decoder().decode(msgspec.msgpack.encode([1.0, [stored(A)], 2**32])).ops == []
