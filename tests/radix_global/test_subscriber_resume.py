"""A restored feed continues from its saved position (``docs/interfaces.md``,
"The router's index snapshot").

The restored index entries of a worker survive only while the engine shows it is the one that
sent the saved batch: the same seq with the same payload in its replay buffer, or (without a
replay endpoint) the next seq live. Every other case drops them and resyncs, and so does a
replay that answers garbage after the saved batch (issue 35). Real ZMQ on loopback
with ``test_subscriber``'s scripted publisher; the run before the restart is a second subscriber
on its own index, whose snapshot the restarted one restores.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import zmq
from test_subscriber import NS, PS, TOPIC, A, B, ScriptedPublisher, env, held, info, stored, until

from radix_global import keys
from radix_global.index import GlobalIndex
from radix_global.snapshot import FeedPosition, FeedState
from radix_global.subscriber import KVEventSubscriber
from radix_global.types import WorkerId

pytestmark = pytest.mark.timeout(30)
__all__ = ["env"]  # the fixture, imported for pytest
C = list(range(300, 308))


async def subscribed_again(pub: ScriptedPublisher) -> None:
    """The next subscription (``verbose``: XPUB would drop a subscription to a topic that is
    still subscribed, and the first run's unsubscription may come either side of it)."""
    while (msg := await asyncio.wait_for(pub.pub.recv(), 5)) != b"\x01" + TOPIC:
        assert msg == b"\x00" + TOPIC, msg


async def first_run(ctx: Any, pub: ScriptedPublisher) -> tuple[GlobalIndex, FeedState]:
    """A router that followed ``pub`` through A (seq 0) and B (seq 1), then stopped: a copy of
    its index and its feeds' state, as a snapshot holds them."""
    index = GlobalIndex()
    sub = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])
        await pub.send([stored(B)])
        await until(lambda: held(index, B) == 2 and held(index, A) == 4)
        state = sub.feed_state(info(pub).worker_id)
        assert state is not None
        return GlobalIndex.restore(index.snapshot()), state
    finally:
        await sub.close()


@pytest.mark.asyncio
async def test_positions_name_the_last_batch_applied(env: Any) -> None:
    ctx, _, sub, _ = env
    pub = ScriptedPublisher(ctx, replay=False)
    try:
        await sub.add_worker(info(pub))
        assert sub.feed_state(info(pub).worker_id) == FeedState([FeedPosition(-1, 0)])
        await pub.wait_subscribed()
        await pub.send([stored(A)])
        await until(lambda: sub.feed_state(info(pub).worker_id).positions[0].seq == 0)
        assert sub.feed_state("nobody") is None
        for bad, why in (([FeedPosition(0, 0)] * 2, "2 feed positions for 1 dp ranks"),
                         ([FeedPosition(2**63, 0)], "outside int64"),
                         ([FeedPosition(-2, 0)], "outside int64")):
            with pytest.raises(ValueError, match=why):
                await sub.add_worker(info(pub, wid="w1"), resume=FeedState(bad))
            assert sub.feed_state("w1") is None  # nothing registered
        assert list(sub.feed_states()) == ["w0"]
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_resumed_feed_replays_what_it_missed_and_keeps_restored_entries(env: Any) -> None:
    ctx, _, _, _ = env
    pub = ScriptedPublisher(ctx)
    try:
        index, state = await first_run(ctx, pub)
        assert state.positions[0].seq == 1
        await pub.send([stored(C)], drop=True)  # seq 2, while no router listened
        sub = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx)
        try:
            await sub.add_worker(info(pub), resume=state)
            await until(lambda: held(index, C) == 2)
            assert held(index, A) == 4 and held(index, B) == 2  # restored, kept
            assert pub.requests[-1] == 1  # asked from the saved seq itself, not from 0
            assert sub.stats().resyncs == 0
        finally:
            await sub.close()
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_garbage_replayed_after_the_saved_batch_drops_restored_entries(env: Any) -> None:
    """The engine vouches for the saved batch, but what it replays after it does not decode
    (issue 35, item 12): those batches are lost, counted, and the worker resyncs."""
    ctx, _, _, _ = env
    pub = ScriptedPublisher(ctx)
    pub.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    try:
        index, state = await first_run(ctx, pub)
        pub.buffer.append((2, b"\xc1 not msgpack"))  # seq 2, while no router listened
        sub = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx)
        try:
            await sub.add_worker(info(pub), resume=state)
            await until(lambda: sub.stats().resyncs == 1)
            assert held(index, A) == 0 and held(index, B) == 0
            assert (sub.stats().replay_lost, sub.stats().replay_failures) == (1, 1)
            await subscribed_again(pub)
            await pub.send([stored(C)])  # seq 3: the feed goes on after the lost batch
            await until(lambda: held(index, C) == 2)
            assert sub.stats().gaps == 0
        finally:
            await sub.close()
    finally:
        pub.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("case", ["restarted", "history_lost", "nothing_buffered", "silent"])
async def test_resume_the_engine_cannot_vouch_for_drops_restored_entries(env: Any,
                                                                          case: str) -> None:
    ctx, _, _, _ = env
    pub = ScriptedPublisher(ctx)
    try:
        index, state = await first_run(ctx, pub)
        if case == "restarted":  # a new stream with as many batches, other payloads
            pub.buffer = []
            await pub.send([stored(C)], drop=True)
            await pub.send([stored(C[:4])], drop=True)
        elif case == "history_lost":  # the buffer moved past the saved batch
            await pub.send([stored(C)], drop=True)
            pub.buffer = pub.buffer[2:]
        elif case == "nothing_buffered":
            pub.buffer = []
        else:
            pub.answer = False
        sub = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx)
        try:
            await sub.add_worker(info(pub), resume=state)
            await until(lambda: sub.stats().resyncs == 1)
            assert held(index, A) == 0 and held(index, B) == 0
            if case in ("restarted", "history_lost"):  # what the engine buffers is taken
                await until(lambda: held(index, C) == 2)
        finally:
            await sub.close()
    finally:
        pub.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("resume", [True, False])
async def test_without_replay_the_next_live_seq_keeps_restored_entries(env: Any,
                                                                       resume: bool) -> None:
    """With the saved position the live seq 2 continues the stream; without it (the control)
    the same message is a gap that drops what was restored."""
    ctx, _, _, _ = env
    pub = ScriptedPublisher(ctx, replay=False)
    pub.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    try:
        index, state = await first_run(ctx, pub)
        sub = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx)
        try:
            await sub.add_worker(info(pub), resume=state if resume else None)
            await subscribed_again(pub)
            await pub.send([stored(C)])
            await until(lambda: held(index, C) == 2)
            assert held(index, A) == (4 if resume else 0)
            assert sub.stats().resyncs == (0 if resume else 1)
            await pub.send([stored(C)], drop=True)  # a later gap still resyncs
            await pub.send([stored(B)])
            await until(lambda: sub.stats().resyncs == (1 if resume else 2))
            assert held(index, A) == 0
        finally:
            await sub.close()
    finally:
        pub.close()


def salted(hashes: list[int], tokens: list[int], parent: int | None = None) -> dict:
    """An SGLang store of a tenant's (salted) pages: engine hashes that are not our keys."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": PS, "lora_id": None, "medium": "GPU",
            "cache_salt": "tenant-a"}  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize("with_map", [True, False])
async def test_salted_pages_resume_with_their_rekeying_map(env: Any, with_map: bool) -> None:
    """A restored salted page's removal and its child are translated with the saved map;
    without it (the control) the child is refused and the removed page stays indexed."""
    ctx, _, _, _ = env
    pub = ScriptedPublisher(ctx, replay=False)
    pub.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    ids = list(range(400, 416))  # 4 pages
    ours = keys.page_keys(ids, PS, cache_salt="tenant-a")
    try:
        index = GlobalIndex()
        sub0 = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx)
        await sub0.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([salted([11, 12], ids[:8])])
        await until(lambda: held_keys(index, ours[:2]) == 2)
        state = sub0.feed_state(info(pub).worker_id)
        assert state is not None and len(state.rekeyed) == 2
        copy = GlobalIndex.restore(index.snapshot())
        await sub0.close()
        sub = KVEventSubscriber(copy, replay_timeout_s=0.5, context=ctx)
        try:
            resume = state if with_map else FeedState(state.positions)
            await sub.add_worker(info(pub), resume=resume)
            await subscribed_again(pub)
            await pub.send([salted([13, 14], ids[8:], parent=12),
                            {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"}])
            await until(lambda: sub.stats().batches == 1)
            if with_map:  # the child went under page 2, then page 2 was removed
                assert sub.stats().refused == {} and held_keys(copy, ours) == 1
            else:
                assert sub.stats().refused == {"unknown_parent": 1}
                assert held_keys(copy, ours) == 2  # the removal was not translated
        finally:
            await sub.close()
    finally:
        pub.close()


def held_keys(index: GlobalIndex, page_keys: list[Any]) -> int:
    hm = index.match(NS, page_keys, now=0.0).matched.get((WorkerId("w0"), 0))
    return 0 if hm is None else hm.gpu
