"""KV-event subscriber: one ZMQ SUB per worker publisher, feeding decoded operations to the index.

Contract (``docs/interfaces.md`` sections 2 and 5):

* Per registered worker (:class:`WorkerInfo`) and data-parallel rank ``r`` (SGLang and vLLM offset
  the publisher's tcp port by ``r``), a SUB socket connects to the ``kv_events_endpoint`` with the
  worker's topic. Messages are ``(topic, seq: 8-byte big-endian, payload)``.
* On joining, the publisher's replay buffer is applied from seq 0 (catch-up: the engine may have
  cached pages before we subscribed). Per publisher, seq must then be the previous one + 1. On a
  gap (including a first live message after seq 0) the missing batches are asked from
  ``kv_events_replay_endpoint`` (DEALER to the engine's ROUTER: send the start seq as 8 bytes
  big-endian, receive ``(topic, seq, payload)`` - or ``(seq, payload)`` from vLLM - until seq -1).
  Without a replay endpoint, or when the replay times out or does not cover the gap, the worker's
  index entries are dropped and the index resyncs from live events. A seq that goes back to 0
  is a restarted engine: resync too.
* A worker's ``pool_events_endpoint`` (its L3 backend's stream: no replay, own seq) is followed
  too, applied to holder ``pool_id``. A gap there is counted but drops nothing: the pool is shared
  by many workers, and removing a worker never drops pool entries.
* A worker not heard from (events or :meth:`heartbeat`) for ``timeout_s`` by the injected clock is
  removed and its entries dropped (:meth:`check_timeouts`, or the :meth:`watch` loop).
* Nothing here raises on bad input: malformed messages and refused operations are counted.

The index must offer ``register_namespace(ns, page_size)``, ``apply(op)`` (raising
``IndexRefusal``) and ``remove_holder(holder)`` (:class:`radix_global.index.GlobalIndex`). All
tasks run on one event loop, so the index needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import zmq
import zmq.asyncio

from radix_global.events import EngineKind, EventDecoder
from radix_global.ops import IndexOp, IndexRefusal, MalformedEventError
from radix_global.registration import WorkerInfo
from radix_global.types import HolderId, Namespace, PoolId, WorkerId

log = logging.getLogger(__name__)

END_SEQ = -1


class IndexSink(Protocol):
    def register_namespace(self, namespace: Namespace, page_size: int) -> None: ...
    def apply(self, op: IndexOp) -> None: ...
    def remove_holder(self, holder: HolderId) -> None: ...


class SubscriberStats(NamedTuple):
    workers: int
    batches: int  # batches decoded (live and replayed)
    ops_applied: int  # index operations accepted
    refused: dict[str, int]  # reason -> count (decoder and index refusals, bad frames)
    gaps: int
    replays: int  # replay requests sent
    replay_failures: int  # timed out, unreachable or not covering the gap
    resyncs: int  # times a worker's entries were dropped to resync from live events
    duplicates: int  # live messages already applied from a replay
    timeouts: int  # workers removed for silence


def offset_endpoint(endpoint: str, rank: int) -> str:
    """The endpoint of dp rank ``rank``: tcp port + rank, ``inproc``/``ipc`` name + ``_dp<rank>``
    (as SGLang's and vLLM's publishers bind them)."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    return f"{endpoint}_dp{rank}"


@dataclass
class _Publisher:
    rank: int
    endpoint: str
    replay_endpoint: str | None
    decoder: EventDecoder  # the worker's, or (pool stream) one with holder = pool id
    is_pool: bool = False
    last_seq: int | None = None  # None: nothing applied yet
    caught_up_to: int | None = None  # last seq the join catch-up applied, until live passes it
    task: asyncio.Task[None] | None = None


@dataclass
class _Feed:
    info: WorkerInfo
    decoder: EventDecoder
    last_heard: float
    publishers: list[_Publisher] = field(default_factory=list)


def _decoders(feed: _Feed) -> list[EventDecoder]:
    out = [feed.decoder]
    out += [p.decoder for p in feed.publishers if p.decoder is not feed.decoder]
    return out


class KVEventSubscriber:
    """Subscribes to every registered worker's KV events and keeps the index in step."""

    def __init__(
        self,
        index: IndexSink,
        *,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 20.0,
        replay_timeout_s: float = 2.0,
        context: zmq.asyncio.Context | None = None,
        lora_extra_keys: Mapping[str, str] | None = None,
        on_timeout: Callable[[WorkerId], None] | None = None,
    ) -> None:
        self._index = index
        self._clock = clock
        self.timeout_s = timeout_s
        self.replay_timeout_s = replay_timeout_s
        self._ctx = context or zmq.asyncio.Context.instance()
        self._lora = dict(lora_extra_keys or {})
        self._on_timeout = on_timeout
        self._feeds: dict[WorkerId, _Feed] = {}
        self._counts: Counter[str] = Counter()
        self._bad_frames = 0
        self._retired_refusals: Counter[str] = Counter()

    # ---- membership -----------------------------------------------------------------------
    async def add_worker(
        self, info: WorkerInfo, lora_extra_keys: Mapping[str, str] | None = None
    ) -> None:
        """Start following ``info`` (replaces a previous registration of the same id).
        ``lora_extra_keys``: this worker's adapters, over the subscriber-wide map."""
        wid = WorkerId(info.worker_id)
        if wid in self._feeds:
            await self.remove_worker(wid)
        self._index.register_namespace(Namespace(info.namespace), info.page_size)
        engine = EngineKind.SGLANG if info.engine == "sglang" else EngineKind.VLLM
        lora = {**self._lora, **(lora_extra_keys or {})}
        decoder = EventDecoder(
            wid, Namespace(info.namespace), info.page_size, engine, lora_extra_keys=lora
        )
        feed = _Feed(info, decoder, self._clock())
        self._feeds[wid] = feed
        if info.pool_events_endpoint is not None and info.pool_id is not None:
            self._add_pool_stream(feed, info)
        if info.kv_events_endpoint is None:
            return  # heartbeat-only worker: nothing to subscribe to
        for rank in range(info.dp_size):
            replay = info.kv_events_replay_endpoint
            pub = _Publisher(
                rank,
                offset_endpoint(info.kv_events_endpoint, rank),
                None if replay is None else offset_endpoint(replay, rank),
                decoder,
            )
            pub.task = asyncio.create_task(self._follow(feed, pub), name=f"kv-sub-{wid}-{rank}")
            feed.publishers.append(pub)

    async def remove_worker(self, worker_id: WorkerId) -> bool:
        """Stop following a worker and drop its index entries; False if unknown."""
        feed = self._feeds.pop(worker_id, None)
        if feed is None:
            return False
        tasks = [p.task for p in feed.publishers if p.task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for d in _decoders(feed):
            self._retired_refusals.update(d.refused)
        self._index.remove_holder(worker_id)
        return True

    def _add_pool_stream(self, feed: _Feed, info: WorkerInfo) -> None:
        assert info.pool_events_endpoint is not None and info.pool_id is not None
        decoder = EventDecoder(
            PoolId(info.pool_id), Namespace(info.namespace), info.page_size, EngineKind.SGLANG
        )
        pub = _Publisher(0, info.pool_events_endpoint, None, decoder, is_pool=True)
        pub.task = asyncio.create_task(self._follow(feed, pub), name=f"kv-pool-{info.worker_id}")
        feed.publishers.append(pub)

    def heartbeat(self, worker_id: WorkerId) -> bool:
        """Record a heartbeat; False if the worker is unknown (it must re-register)."""
        feed = self._feeds.get(worker_id)
        if feed is None:
            return False
        feed.last_heard = self._clock()
        return True

    async def check_timeouts(self) -> list[WorkerId]:
        """Remove every worker silent for longer than ``timeout_s``; returns their ids."""
        now = self._clock()
        stale = [w for w, f in self._feeds.items() if now - f.last_heard > self.timeout_s]
        for wid in stale:
            log.warning(
                "worker %s silent for > %.1fs: removed, entries dropped", wid, self.timeout_s
            )
            await self.remove_worker(wid)
            self._counts["timeouts"] += 1
            if self._on_timeout is not None:
                self._on_timeout(wid)
        return stale

    async def watch(self, interval_s: float = 1.0) -> None:
        """Run :meth:`check_timeouts` forever (cancel to stop)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.check_timeouts()

    async def close(self) -> None:
        for wid in list(self._feeds):
            await self.remove_worker(wid)

    def workers(self) -> list[WorkerId]:
        return list(self._feeds)

    def stats(self) -> SubscriberStats:
        refused = Counter(self._retired_refusals)
        for f in self._feeds.values():
            for d in _decoders(f):
                refused.update(d.refused)
        c = self._counts
        return SubscriberStats(
            len(self._feeds), c["batches"], c["ops_applied"], dict(refused), c["gaps"],
            c["replays"], c["replay_failures"], c["resyncs"], c["duplicates"], c["timeouts"],
        )  # fmt: skip

    # ---- per-publisher loop ---------------------------------------------------------------
    async def _follow(self, feed: _Feed, pub: _Publisher) -> None:
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, feed.info.kv_events_topic.encode())
        sock.connect(pub.endpoint)
        try:
            if pub.replay_endpoint is not None:
                try:
                    await self._catch_up(feed, pub)
                except Exception:  # a failed catch-up only costs history, never the feed
                    log.exception("%s: catch-up replay failed", feed.info.worker_id)
            while True:
                frames = await sock.recv_multipart()
                try:
                    await self._on_message(feed, pub, frames)
                except Exception:  # never let one message stop the feed
                    log.exception("%s: failed to handle a KV-event message", feed.info.worker_id)
                    pub.decoder.refuse(MalformedEventError("internal error handling message"))
        finally:
            sock.close(linger=0)

    async def _on_message(self, feed: _Feed, pub: _Publisher, frames: list[bytes]) -> None:
        feed.last_heard = self._clock()
        if len(frames) != 3 or len(frames[1]) != 8:
            pub.decoder.refuse(MalformedEventError(f"expected 3 frames, got {len(frames)}"))
            return
        seq = int.from_bytes(frames[1], "big")
        expected = 0 if pub.last_seq is None else pub.last_seq + 1
        if pub.caught_up_to is not None and seq > pub.caught_up_to:
            pub.caught_up_to = None
        if seq == 0 and pub.last_seq is not None and pub.caught_up_to is None:
            log.warning("%s rank %d: seq restarted at 0", feed.info.worker_id, pub.rank)
            self._resync(feed, pub, seq)
        elif seq < expected:
            self._counts["duplicates"] += 1
            return
        elif seq > expected:
            self._counts["gaps"] += 1
            if not await self._fill_gap(feed, pub, seq):
                self._resync(feed, pub, seq)
            if pub.last_seq is not None and seq <= pub.last_seq:
                return  # the replay already applied it
        self._apply(pub, frames[2])
        pub.last_seq = seq

    def _apply(self, pub: _Publisher, payload: bytes) -> None:
        decoded = pub.decoder.decode(payload)
        self._counts["batches"] += 1
        for op in decoded.ops:
            try:
                self._index.apply(op)
            except IndexRefusal as exc:
                pub.decoder.refuse(exc)
            else:
                self._counts["ops_applied"] += 1

    def _resync(self, feed: _Feed, pub: _Publisher, seq: int) -> None:
        pub.last_seq = seq - 1
        if pub.is_pool:
            # The pool is shared: one worker's lost batch must not wipe what the others reported.
            # Missed stores cost hits, missed removals a failed prefetch (interfaces s.5).
            return
        self._counts["resyncs"] += 1
        self._index.remove_holder(WorkerId(feed.info.worker_id))
        feed.decoder.forget()

    async def _catch_up(self, feed: _Feed, pub: _Publisher) -> None:
        """Apply what the publisher still buffers from before we joined (seq 0 on). Live messages
        arriving meanwhile wait in the SUB socket and are skipped as duplicates."""
        assert pub.replay_endpoint is not None
        self._counts["replays"] += 1
        batches = await self._request_replay(pub.replay_endpoint, 0)
        if batches is None:
            self._counts["replay_failures"] += 1
            return
        for s, payload in batches:
            if pub.last_seq is not None and s != pub.last_seq + 1:
                break
            self._apply(pub, payload)
            pub.last_seq = pub.caught_up_to = s

    async def _fill_gap(self, feed: _Feed, pub: _Publisher, seq: int) -> bool:
        """Replay the batches before ``seq``; True when all of them were applied."""
        if pub.replay_endpoint is None:
            return False
        start = 0 if pub.last_seq is None else pub.last_seq + 1
        self._counts["replays"] += 1
        batches = await self._request_replay(pub.replay_endpoint, start)
        if batches is None:
            self._counts["replay_failures"] += 1
            return False
        for s, payload in batches:
            if s < start or (pub.last_seq is not None and s <= pub.last_seq):
                continue
            if s != (0 if pub.last_seq is None else pub.last_seq + 1):
                break  # the publisher's buffer no longer holds what we missed
            self._apply(pub, payload)
            pub.last_seq = s
        covered = pub.last_seq is not None and pub.last_seq >= seq - 1
        if not covered:
            self._counts["replay_failures"] += 1
        return covered

    async def _request_replay(self, endpoint: str, start: int) -> list[tuple[int, bytes]] | None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.connect(endpoint)
        out: list[tuple[int, bytes]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.replay_timeout_s
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError
                frames = await asyncio.wait_for(sock.recv_multipart(), left)
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) not in (2, 3) or len(frames[-2]) != 8:
                    return None
                s = int.from_bytes(frames[-2], "big", signed=True)
                if s == END_SEQ:
                    return out
                out.append((s, frames[-1]))
        except (TimeoutError, zmq.ZMQError) as exc:
            log.warning("replay from %s (start %d) failed: %r", endpoint, start, exc)
            return None
        finally:
            sock.close(linger=0)
