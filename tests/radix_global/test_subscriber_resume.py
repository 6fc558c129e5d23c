"""A restored feed continues from its saved position (``docs/interfaces.md`` s.18).

The restored index entries of a worker survive only while the engine shows it is the one that
sent the saved batch: the same seq with the same payload in its replay buffer, or (without a
replay endpoint) the next seq live. Every other case drops them and resyncs. Real ZMQ on loopback
with ``test_subscriber``'s scripted publisher; the run before the restart is a second subscriber
on its own index, whose snapshot the restarted one restores.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import zmq
from test_subscriber import TOPIC, A, B, ScriptedPublisher, env, held, info, stored, until

from radix_global.index import GlobalIndex
from radix_global.snapshot import FeedPosition
from radix_global.subscriber import KVEventSubscriber

pytestmark = pytest.mark.timeout(30)
__all__ = ["env"]  # the fixture, imported for pytest
C = list(range(300, 308))


async def subscribed_again(pub: ScriptedPublisher) -> None:
    """The next subscription (``verbose``: XPUB would drop a subscription to a topic that is
    still subscribed, and the first run's unsubscription may come either side of it)."""
    while (msg := await asyncio.wait_for(pub.pub.recv(), 5)) != b"\x01" + TOPIC:
        assert msg == b"\x00" + TOPIC, msg


async def first_run(ctx: Any, pub: ScriptedPublisher) -> tuple[GlobalIndex, list[FeedPosition]]:
    """A router that followed ``pub`` through A (seq 0) and B (seq 1), then stopped: a copy of
    its index and its feed positions, as a snapshot holds them."""
    index = GlobalIndex()
    sub = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])
        await pub.send([stored(B)])
        await until(lambda: held(index, B) == 2 and held(index, A) == 4)
        positions = sub.positions(info(pub).worker_id)
        assert positions is not None
        return GlobalIndex.restore(index.snapshot()), positions
    finally:
        await sub.close()


@pytest.mark.asyncio
async def test_positions_name_the_last_batch_applied(env: Any) -> None:
    ctx, _, sub, _ = env
    pub = ScriptedPublisher(ctx, replay=False)
    try:
        await sub.add_worker(info(pub))
        assert sub.positions(info(pub).worker_id) == [FeedPosition(-1, 0)]
        await pub.wait_subscribed()
        await pub.send([stored(A)])
        await until(lambda: sub.positions(info(pub).worker_id)[0].seq == 0)
        assert sub.positions("nobody") is None
        with pytest.raises(ValueError, match="2 feed positions for 1 dp ranks"):
            await sub.add_worker(info(pub, wid="w1"), resume=[FeedPosition(0, 0)] * 2)
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_resumed_feed_replays_what_it_missed_and_keeps_restored_entries(env: Any) -> None:
    ctx, _, _, _ = env
    pub = ScriptedPublisher(ctx)
    try:
        index, positions = await first_run(ctx, pub)
        assert positions[0].seq == 1
        await pub.send([stored(C)], drop=True)  # seq 2, while no router listened
        sub = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx)
        try:
            await sub.add_worker(info(pub), resume=positions)
            await until(lambda: held(index, C) == 2)
            assert held(index, A) == 4 and held(index, B) == 2  # restored, kept
            assert pub.requests[-1] == 1  # asked from the saved seq itself, not from 0
            assert sub.stats().resyncs == 0
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
        index, positions = await first_run(ctx, pub)
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
            await sub.add_worker(info(pub), resume=positions)
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
        index, positions = await first_run(ctx, pub)
        sub = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx)
        try:
            await sub.add_worker(info(pub), resume=positions if resume else None)
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
