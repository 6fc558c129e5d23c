"""KVEventSubscriber over real ZMQ on loopback, with a scripted publisher and the real index.

The scripted publisher speaks SGLang's wire protocol (XPUB so the test knows when the subscription
is live; a ROUTER replay socket answering ``(topic, seq, payload)`` ... ``seq -1``) and can drop
chosen seqs from the live stream to make gaps.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import zmq
import zmq.asyncio

from radix_global import keys
from radix_global.index import GlobalIndex
from radix_global.registration import WorkerInfo
from radix_global.subscriber import KVEventSubscriber, offset_endpoint
from radix_global.types import Namespace, WorkerId

pytestmark = pytest.mark.timeout(30)
NS = Namespace("m@1")
PS = 4
TOPIC = b"kv-events"


class ScriptedPublisher:
    """Numbered batches on an XPUB socket, a replay ROUTER; ``drop`` seqs never go out live."""

    def __init__(self, ctx: zmq.asyncio.Context, replay: bool = True, answer: bool = True) -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = ctx.socket(zmq.ROUTER) if replay else None
        self.replay_endpoint = None
        if self.router is not None:
            self.router.bind("tcp://127.0.0.1:*")
            self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.answer = answer
        self.rank = 0  # attn_dp_rank written into every batch
        self.buffer: list[tuple[int, bytes]] = []
        self.requests: list[int] = []
        self._task = asyncio.create_task(self._serve()) if self.router is not None else None

    async def wait_subscribed(self) -> None:
        msg = await asyncio.wait_for(self.pub.recv(), 5)
        assert msg == b"\x01" + TOPIC

    async def send(self, events: list[Any], drop: bool = False, seq: int | None = None,
                   ts: float | None = None) -> int:
        seq = len(self.buffer) if seq is None else seq
        payload = msgspec.msgpack.encode([float(seq) if ts is None else ts, events, self.rank])
        self.buffer.append((seq, payload))
        if not drop:
            await self.pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])
        return seq

    async def _serve(self) -> None:
        assert self.router is not None
        while True:
            ident, _, start = await self.router.recv_multipart()
            self.requests.append(int.from_bytes(start, "big"))
            if not self.answer:
                continue
            for s, buf in self.buffer:
                if s >= int.from_bytes(start, "big"):
                    await self.router.send_multipart([ident, b"", TOPIC, s.to_bytes(8, "big"), buf])
            await self.router.send_multipart(
                [ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""]
            )

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


def stored(tokens: list[int], parent: int | None = None, full: list[int] | None = None) -> dict:
    """Store ``tokens``; if they continue ``full`` (the whole sequence), hash them in its chain."""
    hashes = keys.page_keys(full or tokens, PS)[-(len(tokens) // PS) :]
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": PS, "lora_id": None, "medium": "GPU"}  # fmt: skip


def info(pub: ScriptedPublisher, wid: str = "w0", **kw: Any) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, url="http://127.0.0.1:1", model="m", namespace=NS,
                      page_size=PS, kv_events_endpoint=pub.endpoint,
                      kv_events_replay_endpoint=pub.replay_endpoint, **kw)  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.01)


def held(index: GlobalIndex, tokens: list[int], wid: str = "w0") -> int:
    m = index.match(NS, keys.page_keys(tokens, PS), now=0.0)
    hm = m.matched.get((WorkerId(wid), 0))
    return 0 if hm is None else hm.gpu


@pytest_asyncio.fixture
async def env() -> AsyncIterator[tuple[zmq.asyncio.Context, GlobalIndex, KVEventSubscriber, Clock]]:
    ctx = zmq.asyncio.Context()
    index = GlobalIndex()
    clock = Clock()
    sub = KVEventSubscriber(index, clock=clock, timeout_s=20.0, replay_timeout_s=0.5, context=ctx)
    try:
        yield ctx, index, sub, clock
    finally:
        await sub.close()
        ctx.destroy(linger=0)


A = list(range(100, 116))  # 4 pages
B = list(range(200, 208))


@pytest.mark.asyncio
async def test_live_events_reach_the_index(env: Any) -> None:
    ctx, index, sub, _ = env
    pub = ScriptedPublisher(ctx, replay=False)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])
        await until(lambda: held(index, A) == 4)
        await pub.send(
            [{"type": "BlockRemoved", "block_hashes": keys.page_keys(A, PS)[2:], "medium": "GPU"}]
        )
        await until(lambda: held(index, A) == 2)
        s = sub.stats()
        assert (s.batches, s.ops_applied, s.gaps, s.resyncs) == (2, 2, 0, 0)
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_gap_filled_by_replay(env: Any) -> None:
    ctx, index, sub, _ = env
    pub = ScriptedPublisher(ctx)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A[:8])])
        await until(lambda: held(index, A) == 2)  # live or by catch-up: either way the join is over
        lost = stored(A[8:], parent=keys.page_keys(A, PS)[1], full=A)
        await pub.send([lost], drop=True)  # seq 1
        await pub.send([stored(B)])
        await until(lambda: held(index, B) == 2)
        assert held(index, A) == 4  # seq 1 came from the replay
        s = sub.stats()
        assert (s.gaps, s.replays, s.replay_failures, s.resyncs) == (1, 2, 0, 0)
        assert pub.requests == [0, 1]  # catch-up on join, then the gap
        assert s.refused == {}
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_first_message_after_seq_0_replays_history(env: Any) -> None:
    ctx, index, sub, _ = env
    pub = ScriptedPublisher(ctx)
    try:
        await pub.send([stored(A)], drop=True)  # published before we subscribed
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(B)])
        await until(lambda: held(index, B) == 2)
        assert held(index, A) == 4 and pub.requests == [0]
    finally:
        pub.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["no_replay_endpoint", "replay_silent"])
async def test_unfillable_gap_drops_entries_and_resyncs(env: Any, mode: str) -> None:
    ctx, index, sub, _ = env
    pub = ScriptedPublisher(ctx, replay=mode != "no_replay_endpoint", answer=False)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])
        await until(lambda: held(index, A) == 4)
        await pub.send(
            [{"type": "BlockRemoved", "block_hashes": keys.page_keys(A, PS), "medium": "GPU"}],
            drop=True,
        )
        await pub.send([stored(B)])
        await until(lambda: held(index, B) == 2)
        assert held(index, A) == 0  # stale entries were dropped, not kept
        s = sub.stats()
        assert (s.gaps, s.resyncs) == (1, 1)
        assert s.replay_failures == (2 if mode == "replay_silent" else 0)  # catch-up + gap
        await pub.send([stored(A)])
        await until(lambda: held(index, A) == 4)  # resynced: live events apply again
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_heartbeat_timeout_removes_worker(env: Any) -> None:
    ctx, index, sub, clock = env
    pub = ScriptedPublisher(ctx, replay=False)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])
        await until(lambda: held(index, A) == 4)
        clock.t += 15
        assert sub.heartbeat(WorkerId("w0"))
        clock.t += 15
        assert await sub.check_timeouts() == []
        clock.t += 21
        assert await sub.check_timeouts() == [WorkerId("w0")]
        assert held(index, A) == 0 and sub.workers() == [] and sub.stats().timeouts == 1
        assert not sub.heartbeat(WorkerId("w0"))
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_bad_frames_and_refusals_counted_feed_survives(env: Any) -> None:
    ctx, index, sub, _ = env
    pub = ScriptedPublisher(ctx, replay=False)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.pub.send_multipart([TOPIC, b"\x00"])  # not (topic, seq, payload)
        await pub.send([stored(A[:4], parent=12345)])  # index: unknown parent
        await pub.send([dict(stored(A), block_size=8)])  # decoder: page size mismatch
        await pub.send([stored(A)])
        await until(lambda: held(index, A) == 4)
        assert sub.stats().refused == {"malformed": 1, "unknown_parent": 1, "page_size_mismatch": 1}
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_restarted_publisher_resyncs(env: Any) -> None:
    ctx, index, sub, _ = env
    pub = ScriptedPublisher(ctx, replay=False)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await pub.send([stored(A)])
        await pub.send([stored(B)])
        await until(lambda: held(index, B) == 2)
        await pub.send([stored(B)], seq=0)  # engine restarted: its cache is empty but for B
        await until(lambda: sub.stats().resyncs == 1)
        assert held(index, A) == 0 and held(index, B) == 2
    finally:
        pub.close()


def test_offset_endpoint() -> None:
    assert offset_endpoint("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_endpoint("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"


@pytest.mark.asyncio
async def test_dp_ranks_get_one_subscription_each(env: Any) -> None:
    ctx, index, sub, _ = env
    pubs = [ScriptedPublisher(ctx, replay=False) for _ in range(2)]
    # Rank r publishes at port + r: move both publishers to two adjacent free ports.
    for p in pubs:
        p.pub.close(linger=0)
    for _ in range(50):
        socks = [ctx.socket(zmq.XPUB) for _ in range(2)]
        try:
            socks[0].bind("tcp://127.0.0.1:*")
            base = int(socks[0].getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
            socks[1].bind(f"tcp://127.0.0.1:{base + 1}")
            break
        except zmq.ZMQError:
            for sk in socks:
                sk.close(linger=0)
    for p, sk in zip(pubs, socks, strict=True):
        p.pub, p.endpoint = sk, sk.getsockopt_string(zmq.LAST_ENDPOINT)
    pubs[1].rank = 1
    try:
        await sub.add_worker(info(pubs[0], dp_size=2))
        for p in pubs:
            await p.wait_subscribed()
        await pubs[1].send([stored(A)])
        await pubs[0].send([stored(B)])
        await until(lambda: held(index, B) == 2)
        await until(lambda: index.match(NS, keys.page_keys(A, PS), 0.0).best_pages == 4)
        m = index.match(NS, keys.page_keys(A, PS), 0.0)
        assert set(m.matched) == {(WorkerId("w0"), 1)}  # the batch's dp rank, not rank 0
        assert sub.stats().gaps == 0
    finally:
        for p in pubs:
            p.close()


@pytest.mark.asyncio
async def test_pool_stream_applies_to_pool_holder_and_survives_gaps(env: Any) -> None:
    from sglang_patch.pool.events import block_removed, block_stored

    ctx, index, sub, _ = env
    events, pool = ScriptedPublisher(ctx, replay=False), ScriptedPublisher(ctx, replay=False)
    ka, kb = keys.page_keys(A, PS), keys.page_keys(B, PS)
    try:
        await sub.add_worker(info(events, pool_id="shm-0", pool_events_endpoint=pool.endpoint))
        await asyncio.gather(events.wait_subscribed(), pool.wait_subscribed())
        await pool.send([block_stored(ka, None, PS)])
        await until(lambda: index.match(NS, ka, 0.0).best_pages == 4)
        m = index.match(NS, ka, 0.0)
        assert m.matched == {("shm-0", 0): (0, 0, 4)}  # pool tier only, holder = pool id
        await pool.send([block_removed(ka[2:])], drop=True)  # a lost pool batch
        await pool.send([block_stored(kb, None, PS)])
        await until(lambda: index.match(NS, kb, 0.0).best_pages == 2)
        s = sub.stats()
        assert (s.gaps, s.resyncs) == (1, 0)
        assert index.match(NS, ka, 0.0).best_pages == 4  # nothing dropped for a pool gap
        await sub.remove_worker(WorkerId("w0"))
        assert index.match(NS, ka, 0.0).best_pages == 4  # the pool outlives the worker
    finally:
        events.close()
        pool.close()


@pytest.mark.asyncio
async def test_event_lag_is_measured_on_live_batches_only(env: Any) -> None:
    """Lag = our wall clock - the batch's ts, for live batches; a replayed batch (old by design)
    and one stamped 0 are not counted; a worker that leaves is no longer exported."""
    ctx, index, _, _ = env
    sub = KVEventSubscriber(index, replay_timeout_s=0.5, context=ctx, wall_clock=lambda: 1000.0)
    pub = ScriptedPublisher(ctx)
    try:
        await sub.add_worker(info(pub))
        await pub.wait_subscribed()
        await until(lambda: pub.requests == [0])  # the join's catch-up is answered: all live now
        await pub.send([stored(A[:8])], ts=999.99)
        await pub.send([stored(B)], ts=990.0, drop=True)  # comes by the replay
        # the gap's replay applies this one too: its live copy is then a duplicate
        await pub.send([stored(A[8:], parent=keys.page_keys(A, PS)[1], full=A)], ts=999.0)
        await until(lambda: held(index, A) == 4 and held(index, B) == 2)
        await pub.send([stored(list(range(400, 404)))], ts=999.5)
        await pub.send([stored(list(range(300, 304)))], ts=0.0)  # stamps none
        await until(lambda: sub.stats().batches == 5)
        lag = sub.stats().lag
        assert lag is not None and sum(lag.counts) == 2
        assert lag.sum_s == pytest.approx(0.51)
        assert lag.by_worker == {"w0": pytest.approx(0.5)}
        assert lag.counts[lag.bounds_s.index(0.01)] == 1  # 0.01 s lands in the le=0.01 bucket
        assert sub.stats().as_dict()["lag"]["by_worker"] == lag.by_worker
        await sub.remove_worker(WorkerId("w0"))
        assert sub.stats().lag.by_worker == {}  # type: ignore[union-attr]
    finally:
        await sub.close()
        pub.close()


@pytest.mark.asyncio
async def test_an_own_context_follows_more_than_1023_sockets() -> None:
    """Without a context given, the subscriber makes its own at its first socket, not capped at
    ZMQ's default 1,023 sockets (a router following 1,100 engines failed to subscribe the last
    77), raises the open files limit, and closes the context with itself."""
    sub = KVEventSubscriber(GlobalIndex())
    assert sub._own_ctx is None  # nothing followed, no context
    ctx = sub._ctx
    assert ctx.get(zmq.MAX_SOCKETS) > 1023
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1300:
        pytest.skip("this host's hard limit on open files is below what 1,100 sockets take")
    socks = [ctx.socket(zmq.SUB) for _ in range(1100)]  # as many as 1,100 engines' feeds
    for s in socks:
        s.close(linger=0)
    await sub.close()
    assert ctx.closed and sub._own_ctx is None
