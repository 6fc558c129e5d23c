"""SGLang's own RadixCache and ZMQ publisher -> our subscriber -> GlobalIndex, on loopback.

Real parts: SGLang's ``RadixCache`` with KV events on (page size 4), its ``EventPublisherFactory`` /
``ZmqEventPublisher`` (PUB + replay ROUTER on 127.0.0.1), our ``KVEventSubscriber`` and the real
``GlobalIndex``. The index is queried with keys computed by ``radix_global.keys`` from the same
tokens: this is the router/engine key parity check.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
import zmq
import zmq.asyncio

from radix_global import keys
from radix_global.index import GlobalIndex
from radix_global.registration import WorkerInfo
from radix_global.subscriber import KVEventSubscriber
from radix_global.types import Namespace, WorkerId
from sglang_patch.ports import free_port as _free_port

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.asyncio, pytest.mark.timeout(300)]
NS = Namespace("tiny@1")
PS = 4
W = WorkerId("sgl-0")
TOPIC = "kv-events"


class _Alloc:
    device = "cpu"

    def free_segment(self, *args: Any, **kwargs: Any) -> None:
        pass


@pytest.fixture(scope="module")
def sgl() -> Any:
    from sglang_patch import cpu_compat

    cpu_compat.apply()
    import sglang.srt.disaggregation.kv_events as kv_events
    import sglang.srt.mem_cache.base_prefix_cache as base
    import sglang.srt.mem_cache.radix_cache as radix_cache

    return kv_events, radix_cache, base


class Engine:
    """One SGLang worker's KV cache plus its real publisher, driven like the scheduler does."""

    def __init__(self, sgl: Any, drop_seqs: frozenset[int] = frozenset()) -> None:
        kv_events, radix_cache, base = sgl
        self._kv, self._rc, self._base = kv_events, radix_cache, base
        port, replay = _free_port(), _free_port()
        self.endpoint, self.replay_endpoint = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}"
        config = {"publisher": "zmq", "endpoint": self.endpoint, "bind": True,
                  "replay_endpoint": self.replay_endpoint, "topic": TOPIC}  # fmt: skip
        self.publisher = kv_events.EventPublisherFactory.create(json.dumps(config), attn_dp_rank=0)
        if drop_seqs:
            self.publisher._pub = _DroppingPub(self.publisher._pub, drop_seqs)
        self.cache = radix_cache.RadixCache.create_simulated(
            mock_allocator=_Alloc(), page_size=PS, enable_kv_cache_events=True
        )

    def insert(self, tokens: list[int], cache_salt: str | None = None) -> None:
        key = self._rc.RadixKey(list(tokens), cache_salt=cache_salt)
        import torch

        self.cache.insert(self._base.InsertParams(key=key, value=torch.arange(len(tokens))))

    def evict_all(self) -> None:
        self.cache.evict(self._base.EvictParams(num_tokens=1 << 20))

    def publish(self) -> None:
        """What SGLang's scheduler does each step: take the cache's events, publish one batch."""
        events = self.cache.take_events()
        self.publisher.publish(self._kv.KVEventBatch(ts=time.time(), events=events))

    def info(self) -> WorkerInfo:
        return WorkerInfo(worker_id=W, url="http://127.0.0.1:1", model="tiny", namespace=NS,
                          page_size=PS, kv_events_endpoint=self.endpoint,
                          kv_events_replay_endpoint=self.replay_endpoint,
                          kv_events_topic=TOPIC)  # fmt: skip

    def close(self) -> None:
        self.publisher.shutdown()


class _DroppingPub:
    """Wraps the publisher's PUB socket and loses chosen seqs on the wire (the replay buffer,
    filled after the send, still has them): a network drop, not a change to SGLang."""

    def __init__(self, sock: Any, drop: frozenset[int]) -> None:
        self._sock, self._drop = sock, drop

    def send_multipart(self, frames: Any, *a: Any, **kw: Any) -> Any:
        if int.from_bytes(frames[1], "big") in self._drop:
            return None
        return self._sock.send_multipart(frames, *a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


def gpu_pages(index: GlobalIndex, tokens: list[int], **kw: Any) -> int:
    m = index.match(NS, keys.page_keys(tokens, PS, **kw), now=0.0)
    hm = m.matched.get((W, 0))
    return 0 if hm is None else hm.gpu


@pytest_asyncio.fixture
async def stack() -> AsyncIterator[tuple[GlobalIndex, KVEventSubscriber]]:
    ctx = zmq.asyncio.Context()
    index = GlobalIndex()
    sub = KVEventSubscriber(index, replay_timeout_s=2.0, context=ctx)
    try:
        yield index, sub
    finally:
        await sub.close()
        ctx.destroy(linger=0)


A = list(range(1000, 1016))  # 4 pages
A_EXT = [*A, *range(2000, 2008)]  # A + 2 pages
S = list(range(3000, 3012))  # 3 pages, inserted with a cache_salt


async def test_inserts_evictions_and_reset_reach_the_index(sgl: Any, stack: Any) -> None:
    index, sub = stack
    engine = Engine(sgl)
    try:
        await sub.add_worker(engine.info())
        engine.insert(A)
        engine.publish()
        await until(lambda: gpu_pages(index, A) == 4)  # live, or by the catch-up replay
        engine.insert(A_EXT)
        engine.insert(S, cache_salt="tenant-1")
        engine.publish()
        await until(lambda: gpu_pages(index, S, cache_salt="tenant-1") == 3)
        assert gpu_pages(index, A_EXT) == 6
        assert gpu_pages(index, S) == 0  # the salted pages are not the plain ones
        assert gpu_pages(index, A_EXT[:7]) == 1  # only full pages are keyed

        engine.evict_all()
        engine.publish()
        await until(lambda: gpu_pages(index, A) == 0)
        await until(lambda: gpu_pages(index, S, cache_salt="tenant-1") == 0)

        engine.insert(A)
        engine.insert(S, cache_salt="tenant-1")
        engine.publish()
        await until(lambda: gpu_pages(index, S, cache_salt="tenant-1") == 3)
        assert gpu_pages(index, A) == 4
        engine.cache.reset()  # AllBlocksCleared
        engine.publish()
        await until(lambda: gpu_pages(index, A) == 0)
        assert gpu_pages(index, S, cache_salt="tenant-1") == 0
        s = sub.stats()
        assert s.refused == {} and s.resyncs == 0 and s.replay_failures == 0
    finally:
        engine.close()


async def test_gap_replayed_from_real_publisher(sgl: Any, stack: Any) -> None:
    index, sub = stack
    engine = Engine(sgl, drop_seqs=frozenset({1}))
    try:
        await sub.add_worker(engine.info())
        await asyncio.sleep(0.3)  # let the SUB connect so seq 0 arrives live
        engine.insert(A)
        engine.publish()  # seq 0
        await until(lambda: gpu_pages(index, A) == 4)
        engine.insert(A_EXT)
        engine.publish()  # seq 1: lost on the wire
        engine.insert(S, cache_salt="tenant-1")
        engine.publish()  # seq 2: reveals the gap
        await until(lambda: gpu_pages(index, S, cache_salt="tenant-1") == 3)
        assert gpu_pages(index, A_EXT) == 6  # seq 1's pages came through SGLang's replay ROUTER
        s = sub.stats()
        assert (s.gaps, s.replays, s.replay_failures, s.resyncs) == (1, 2, 0, 0)  # join + gap
    finally:
        engine.close()


async def test_late_subscriber_catches_up_by_replay(sgl: Any, stack: Any) -> None:
    index, sub = stack
    engine = Engine(sgl)
    try:
        engine.insert(A)
        engine.publish()  # nobody listens yet
        await asyncio.sleep(0.3)
        await sub.add_worker(engine.info())
        await until(lambda: gpu_pages(index, A) == 4)  # no live batch needed: catch-up on join
        assert sub.stats().replays == 1
    finally:
        engine.close()
