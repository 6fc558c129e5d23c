"""KV-event subscriber: one ZMQ SUB per worker publisher, feeding decoded operations to the index.

Contract (``docs/interfaces.md`` sections "Worker registration" and "Events in"):

* Per registered worker (:class:`WorkerInfo`) and data-parallel rank ``r`` (SGLang and vLLM offset
  the publisher's tcp port by ``r``), a SUB socket connects to the ``kv_events_endpoint`` with the
  worker's topic. Messages are ``(topic, seq: 8-byte big-endian, payload)``.
* On joining, the publisher's replay buffer is applied from seq 0 (catch-up: the engine may have
  cached pages before we subscribed). Per publisher, seq must then be the previous one + 1. On a
  gap (including a first live message after seq 0) the missing batches are asked from
  ``kv_events_replay_endpoint`` (``radix_global/replay.py``: DEALER to the engine's ROUTER:
  send the start seq as 8 bytes big-endian, receive ``(topic, seq, payload)`` - or ``(seq,
  payload)`` from vLLM - until seq -1).
  Without a replay endpoint, or when the replay times out or does not cover the gap, the worker's
  index entries are dropped and the index resyncs from live events. A seq that goes backwards
  (back to 0, or below what we applied when that seq 0 was missed) and is not a live copy of a
  batch a replay already applied (those come in increasing order) is a restarted engine: its
  old entries are dropped and the new stream is taken from its replay buffer (from seq 0) or,
  without one, from that message on. A seq outside int64's non-negative range is refused
  (``bad_seq``) and changes nothing.
* Every message advances its publisher's seq, whatever its payload: a payload that does not
  decode (deep nesting, garbage, a bug) is a counted refusal, never a false gap or a replay that
  re-delivers it forever. A *replayed* batch whose payload does not decode as a batch
  (``DecodedBatch.unreadable``: the replay endpoint answering garbage) is more: the live copy was
  missed, so what the batch held is lost. Such batches are counted (``replay_lost``) and the
  worker resyncs, as for an unrecoverable gap. A replayed batch that decodes but whose events are
  refused (an unknown event type, say) is no loss: its refusals are counted, as live.
* A worker's ``pool_events_endpoint`` (its L3 backend's stream: no replay, own seq) is followed
  too, applied to holder ``pool_id``. A gap there is counted but drops nothing: the pool is shared
  by many workers, and removing a worker never drops pool entries.
* A worker not heard from (events or :meth:`heartbeat`) for ``timeout_s`` by the injected clock is
  removed and its entries dropped (:meth:`check_timeouts`, or the :meth:`watch` loop).
* Nothing here raises on bad input: malformed messages and refused operations are counted. A
  worker's failure stays that worker's: an endpoint that cannot be subscribed is counted
  (``subscribe_failures``) and the worker stays registered, unfollowed (:meth:`add_worker` says
  so); removing it, its timeout and the :meth:`watch` loop never raise because of it.

The index must offer ``register_namespace(ns, page_size)``, ``apply(op)`` (raising
``IndexRefusal``) and ``remove_holder(holder)`` (:class:`radix_global.index.GlobalIndex`). All
tasks run on one event loop, so the index needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import xxhash
import zmq
import zmq.asyncio

from radix_global.event_lag import EventLag, LagStats
from radix_global.events import EngineKind, EventDecoder
from radix_global.ops import IndexOp, IndexRefusal, MalformedEventError
from radix_global.registration import WorkerInfo
from radix_global.replay import request_replay
from radix_global.snapshot import FeedPosition, FeedState
from radix_global.types import HolderId, Namespace, PoolId, WorkerId

log = logging.getLogger(__name__)

MAX_SEQ = 2**63 - 1  # publishers count in int64 and -1 ends a replay: a bigger seq is bogus


class BadSequenceError(MalformedEventError):
    """A message whose seq cannot be a publisher's (outside int64's non-negative range)."""

    reason = "bad_seq"


class HandlerError(IndexRefusal):
    """Handling a message failed unexpectedly (a bug, or an index error that is no refusal)."""

    reason = "internal"


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
    restarts: int = 0  # publishers whose seq went backwards (restarted engines): resynced
    subscribe_failures: int = 0  # publisher endpoints that could not be subscribed
    replay_lost: int = 0  # replayed batches whose payload did not decode: worker resynced
    lag: LagStats | None = None  # live batches' lag behind their publishers' clocks

    def as_dict(self) -> dict[str, Any]:
        """For JSON (``/admin/stats``, the service's stats): the lag as a map too."""
        out = self._asdict()
        out["lag"] = None if self.lag is None else self.lag._asdict()
        return out


WANTED_OPEN_FILES = 65536


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (every followed engine
    rank holds a socket and its descriptors); the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # an unlimited hard limit (macOS) still caps open files per process: ask for plenty
    target = WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # a sandbox or the OS may refuse: the old limit stands
        log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
        return soft
    log.info("open files limit raised from %d to %d (one socket per followed engine rank)",
             soft, target)
    return target


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
    # The payload of last_seq, hashed only when a snapshot asks (not per event); a resumed
    # feed starts from the snapshot's digest instead.
    last_payload: bytes | None = None
    last_digest: int = 0
    resumed: bool = False  # last_seq came from a restored snapshot: _resume checks it first
    # Seqs (first, last) a replay (join catch-up, gap fill) applied ahead of the live stream,
    # until live passes them: a live seq in there is a copy of a replayed batch, not a restart.
    replayed: tuple[int, int] | None = None
    task: asyncio.Task[None] | None = None


@dataclass
class _Feed:
    info: WorkerInfo
    decoder: EventDecoder
    last_heard: float
    publishers: list[_Publisher] = field(default_factory=list)


def _digest(pub: _Publisher) -> int:
    """xxh64 of the payload of ``pub.last_seq`` (``FeedPosition.digest``)."""
    if pub.last_payload is None:
        return pub.last_digest
    return xxhash.xxh64_intdigest(pub.last_payload)


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
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._index = index
        self._clock = clock
        self._wall = wall_clock  # the clock publishers stamp batches with (event lag)
        self._lag = EventLag()
        self.timeout_s = timeout_s
        self.replay_timeout_s = replay_timeout_s
        # made at the first subscription when not given (a subscriber that never follows a
        # worker holds no context), and destroyed by close() then
        self._given_ctx = context
        self._own_ctx: zmq.asyncio.Context | None = None
        self._lora = dict(lora_extra_keys or {})
        self._on_timeout = on_timeout
        self._feeds: dict[WorkerId, _Feed] = {}
        self._counts: Counter[str] = Counter()
        self._bad_frames = 0
        self._retired_refusals: Counter[str] = Counter()

    # ---- membership -----------------------------------------------------------------------
    async def add_worker(
        self, info: WorkerInfo, lora_extra_keys: Mapping[str, str] | None = None,
        resume: FeedState | None = None,
    ) -> bool:
        """Start following ``info`` (replaces a previous registration of the same id); True when
        every rank's KV events are now subscribed. A rank whose endpoint cannot be subscribed is
        logged and counted, and the worker stays registered (heartbeats, timeout) all the same.
        ``lora_extra_keys``: this worker's adapters, over the subscriber-wide map.

        ``resume``: the feeds' state saved with index entries of this worker that were restored
        (``docs/interfaces.md``, "The router's index snapshot"): the decoder's re-keying map, and
        one position per dp rank from which that rank's feed continues (seq -1: none, a fresh join);
        a rank whose engine cannot show it is the one that sent that batch drops the worker's
        entries. A state that cannot be this worker's raises ``ValueError`` before anything
        changes."""
        wid = WorkerId(info.worker_id)
        if resume is not None:
            if len(resume.positions) != info.dp_size:
                raise ValueError(f"{len(resume.positions)} feed positions for {info.dp_size} "
                                 "dp ranks")
            if not all(-1 <= p.seq <= MAX_SEQ and 0 <= p.digest < 2**64
                       for p in resume.positions):
                raise ValueError("a feed position outside int64 seqs / uint64 digests")
        if wid in self._feeds:
            await self.remove_worker(wid)
        self._index.register_namespace(Namespace(info.namespace), info.page_size)
        engine = EngineKind.SGLANG if info.engine == "sglang" else EngineKind.VLLM
        lora = {**self._lora, **(lora_extra_keys or {})}
        decoder = EventDecoder(
            wid, Namespace(info.namespace), info.page_size, engine, lora_extra_keys=lora,
            dp_size=info.dp_size,
        )
        if resume is not None:
            try:
                decoder.restore_rekeyed(resume.rekeyed)
            except MalformedEventError as exc:
                raise ValueError(str(exc)) from exc
        feed = _Feed(info, decoder, self._clock())
        self._feeds[wid] = feed
        if info.pool_events_endpoint is not None and info.pool_id is not None:
            pool = EventDecoder(
                PoolId(info.pool_id), Namespace(info.namespace), info.page_size, EngineKind.SGLANG,
                disk_holder=PoolId(info.pool_disk_id) if info.pool_disk_id else None,
            )
            self._start(feed, 0, info.pool_events_endpoint, None, pool, f"kv-pool-{wid}")
        if info.kv_events_endpoint is None:
            return False  # heartbeat-only worker: nothing to subscribe to
        subscribed = True
        for rank in range(info.dp_size):
            replay = info.kv_events_replay_endpoint
            try:
                endpoint = offset_endpoint(info.kv_events_endpoint, rank)
                replay_at = None if replay is None else offset_endpoint(replay, rank)
            except ValueError as exc:
                self._subscribe_failed(wid, info.kv_events_endpoint, exc)
                subscribed = False
                continue
            at = resume.positions[rank] if resume is not None else None
            subscribed &= self._start(feed, rank, endpoint, replay_at, decoder,
                                      f"kv-sub-{wid}-{rank}", at)
        return subscribed

    def feed_state(self, worker_id: WorkerId) -> FeedState | None:
        """What a snapshot keeps of the worker's KV-event feeds (positions in rank order, seq -1:
        nothing applied); None for an unknown worker or one without every rank subscribed."""
        feed = self._feeds.get(worker_id)
        if feed is None or not self.subscribed(worker_id):
            return None
        ranks = sorted((p for p in feed.publishers if not p.is_pool), key=lambda p: p.rank)
        return FeedState([FeedPosition(-1 if p.last_seq is None else p.last_seq, _digest(p))
                          for p in ranks], feed.decoder.rekeyed_pages())

    def feed_states(self) -> dict[str, FeedState]:
        """Every followed worker's :meth:`feed_state` (those that have one), for a snapshot."""
        return {w: st for w in self._feeds if (st := self.feed_state(w)) is not None}

    def _start(self, feed: _Feed, rank: int, endpoint: str, replay: str | None,
               decoder: EventDecoder, name: str, at: FeedPosition | None = None) -> bool:
        """Connect a SUB to one publisher and follow it; False (counted) when it cannot."""
        pool = decoder is not feed.decoder
        sock: zmq.asyncio.Socket | None = None
        try:
            sock = self._ctx.socket(zmq.SUB)  # fails too once the context's sockets run out
            sock.setsockopt(zmq.SUBSCRIBE, feed.info.kv_events_topic.encode())
            sock.connect(endpoint)
        except (zmq.ZMQError, ValueError) as exc:  # UnicodeError is a ValueError
            if sock is not None:
                sock.close(linger=0)
            self._subscribe_failed(WorkerId(feed.info.worker_id), endpoint, exc)
            return False
        pub = _Publisher(rank, endpoint, replay, decoder, is_pool=pool)
        if at is not None and at.seq >= 0:
            pub.last_seq, pub.last_digest, pub.resumed = at.seq, at.digest, True
        pub.task = asyncio.create_task(self._follow(feed, pub, sock), name=name)
        feed.publishers.append(pub)
        return True

    def _subscribe_failed(self, wid: WorkerId, endpoint: str, exc: Exception) -> None:
        self._counts["subscribe_failures"] += 1
        log.warning("%s: cannot subscribe to %r (%s): its events are not followed",
                    wid, endpoint[:200], exc)

    def subscribed(self, worker_id: WorkerId) -> bool:
        """Whether the worker's KV events (every rank) are followed."""
        feed = self._feeds.get(worker_id)
        if feed is None or feed.info.kv_events_endpoint is None:
            return False
        ranks = sum(1 for p in feed.publishers if not p.is_pool)
        return ranks == feed.info.dp_size

    async def remove_worker(self, worker_id: WorkerId) -> bool:
        """Stop following a worker and drop its index entries; False if unknown."""
        feed = self._feeds.pop(worker_id, None)
        if feed is None:
            return False
        tasks = [p.task for p in feed.publishers if p.task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception:  # a feed that died must not fail its worker's removal
                log.exception("%s: event feed had failed", worker_id)
        for d in _decoders(feed):
            self._retired_refusals.update(d.refused)
        self._index.remove_holder(worker_id)
        self._lag.forget(worker_id)
        return True

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
            self._counts["timeouts"] += 1
            try:  # one worker's failure must not spare the others their timeout
                await self.remove_worker(wid)
                if self._on_timeout is not None:
                    self._on_timeout(wid)
            except Exception:
                log.exception("worker %s: removal after its timeout failed", wid)
        return stale

    async def watch(self, interval_s: float = 1.0) -> None:
        """Run :meth:`check_timeouts` forever (cancel to stop); a failed round is logged and the
        next one runs: heartbeat timeouts never stop for every worker because of one."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.check_timeouts()
            except Exception:
                log.exception("heartbeat timeout check failed")

    async def close(self) -> None:
        for wid in list(self._feeds):
            await self.remove_worker(wid)
        if self._own_ctx is not None:
            self._own_ctx.destroy(linger=0)
            self._own_ctx = None

    @property
    def _ctx(self) -> zmq.asyncio.Context:
        if self._given_ctx is not None:
            return self._given_ctx
        if self._own_ctx is None:
            # A context allows 1,023 sockets by default and a process 1,024 open files on many
            # systems: a router following more engine ranks than that failed to subscribe the
            # rest ("Too many open files", benchmarks/micro/event_lag.py at 1,100 engines).
            ctx = zmq.asyncio.Context()
            ctx.set(zmq.MAX_SOCKETS, ctx.get(zmq.SOCKET_LIMIT))
            raise_open_files_limit()
            self._own_ctx = ctx
        return self._own_ctx

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
            c["restarts"], c["subscribe_failures"], c["replay_lost"], self._lag.stats(),
        )  # fmt: skip

    # ---- per-publisher loop ---------------------------------------------------------------
    async def _follow(self, feed: _Feed, pub: _Publisher, sock: zmq.asyncio.Socket) -> None:
        try:
            if pub.replay_endpoint is not None:
                try:
                    if pub.resumed:
                        await self._resume(feed, pub)
                    else:
                        await self._catch_up(feed, pub)
                except Exception:  # a failed catch-up only costs history, never the feed
                    log.exception("%s: catch-up replay failed", feed.info.worker_id)
                    if pub.resumed:  # unchecked restored entries must not stay trusted
                        self._resync(feed, pub, 0)
                        pub.last_seq, pub.resumed = None, False
            while True:
                frames = await sock.recv_multipart()
                try:
                    await self._on_message(feed, pub, frames)
                except Exception:  # never let one message stop the feed
                    log.exception("%s: failed to handle a KV-event message", feed.info.worker_id)
                    pub.decoder.refuse(HandlerError("internal error handling message"))
        except zmq.ZMQError as exc:  # the socket itself failed: this feed ends, logged
            log.error("%s rank %d: event feed stopped: %s", feed.info.worker_id, pub.rank, exc)
        finally:
            sock.close(linger=0)

    async def _on_message(self, feed: _Feed, pub: _Publisher, frames: list[bytes]) -> None:
        feed.last_heard = self._clock()
        if len(frames) != 3 or len(frames[1]) != 8:
            pub.decoder.refuse(MalformedEventError(f"expected 3 frames, got {len(frames)}"))
            return
        seq = int.from_bytes(frames[1], "big")
        if seq > MAX_SEQ:  # adopting it would make every later seq look like a duplicate
            pub.decoder.refuse(BadSequenceError(f"seq {seq} is not a publisher's int64 seq"))
            return
        expected = 0 if pub.last_seq is None else pub.last_seq + 1
        if pub.replayed is not None and seq > pub.replayed[1]:
            pub.replayed = None
        if seq < expected:
            if pub.replayed is not None and seq >= pub.replayed[0]:
                self._counts["duplicates"] += 1  # applied already, by the replay
                # Live copies come in order: one at or below this one is a new stream.
                pub.replayed = (seq + 1, pub.replayed[1]) if seq < pub.replayed[1] else None
                return
            log.warning("%s rank %d: seq went back from %d to %d: publisher restarted, resync",
                        feed.info.worker_id, pub.rank, expected - 1, seq)
            self._counts["restarts"] += 1
            self._resync(feed, pub, seq)
            if seq > 0 and pub.replay_endpoint is not None:
                pub.last_seq = None  # a new stream: its history from seq 0, if still buffered
                if not await self._fill_gap(feed, pub, seq):
                    pub.last_seq = seq - 1  # what is left of it is lost: go on from here
        elif seq > expected:
            self._counts["gaps"] += 1
            if not await self._fill_gap(feed, pub, seq):
                self._resync(feed, pub, seq)
        if pub.last_seq is not None and seq <= pub.last_seq:
            return  # the replay already applied it
        pub.last_seq = seq  # first: even a message that fails to apply is behind us
        self._apply(pub, frames[2], live_from=feed.info.worker_id)

    def _apply(self, pub: _Publisher, payload: bytes, live_from: str | None = None) -> bool:
        """Decode and apply one batch; False when its payload did not decode as a batch
        (``DecodedBatch.unreadable``). Never raises (the caller has advanced the seq already).
        ``live_from``: the worker of a live batch, whose lag is measured (a replay's is not)."""
        pub.last_payload = payload
        decoded = pub.decoder.decode(payload)
        self._counts["batches"] += 1
        if live_from is not None and not decoded.unreadable:
            self._lag.observe(live_from, decoded.ts, self._wall())
        for op in decoded.ops:
            try:
                self._index.apply(op)
            except IndexRefusal as exc:
                pub.decoder.refuse(exc)
            except Exception as exc:  # not a refusal: a bug, but one op must not stop the feed
                log.exception("%s: index failed to apply an op", pub.decoder.holder)
                pub.decoder.refuse(HandlerError(f"{type(exc).__name__} applying an op"))
            else:
                self._counts["ops_applied"] += 1
        return not decoded.unreadable

    def _resync(self, feed: _Feed, pub: _Publisher, seq: int) -> None:
        pub.last_seq = seq - 1
        if pub.is_pool:
            # The pool is shared: one worker's lost batch must not wipe what the others reported.
            # Missed stores cost hits, missed removals a failed prefetch (docs/interfaces.md,
            # "Events in").
            return
        self._counts["resyncs"] += 1
        self._index.remove_holder(WorkerId(feed.info.worker_id))
        feed.decoder.forget()

    async def _resume(self, feed: _Feed, pub: _Publisher) -> None:
        """Continue a restored feed: the publisher must still buffer the saved batch itself,
        byte for byte (the same engine, nothing lost), and what follows it is applied. Otherwise
        (a restarted engine, lost history, a failed replay) the restored entries are dropped and
        the feed joins afresh (catch-up from seq 0, unless the replay failed: the live stream
        then decides)."""
        assert pub.replay_endpoint is not None and pub.last_seq is not None
        saved = pub.last_seq
        self._counts["replays"] += 1
        batches = await request_replay(self._ctx, pub.replay_endpoint, saved,
                                       self.replay_timeout_s)
        if batches and batches[0][0] == saved \
                and xxhash.xxh64_intdigest(batches[0][1]) == _digest(pub):
            pub.resumed = False
            self._check_run(feed, pub, self._apply_run(pub, batches[1:]))
            return
        why = ("replay failed" if batches is None else "nothing buffered" if not batches
               else f"buffer starts at {batches[0][0]}" if batches[0][0] != saved
               else "another payload: a restarted engine")
        log.warning("%s rank %d: the engine does not hold restored batch %d (%s): its restored "
                    "entries are dropped", feed.info.worker_id, pub.rank, saved, why)
        self._resync(feed, pub, 0)
        pub.last_seq, pub.resumed = None, False
        if batches is None:
            self._counts["replay_failures"] += 1
        else:
            await self._catch_up(feed, pub)

    def _apply_run(self, pub: _Publisher, batches: list[tuple[int, bytes]]) -> int:
        """Apply replayed batches while they continue ``last_seq`` (the first gap stops: the live
        stream shows it); they are ahead of live, whose copies are then duplicates. Returns how
        many of them did not decode (:meth:`_check_run`)."""
        lost = 0
        for s, payload in batches:
            if pub.last_seq is not None and s != pub.last_seq + 1:
                break
            pub.replayed = (s if pub.replayed is None else pub.replayed[0], s)
            pub.last_seq = s
            lost += not self._apply(pub, payload)
        return lost

    def _check_run(self, feed: _Feed, pub: _Publisher, lost: int) -> None:
        """After a catch-up or resume run: garbage in it lost what those batches held, so the
        worker resyncs and its feed goes on after the run (live copies of the replayed batches
        stay duplicates)."""
        if lost:
            assert pub.last_seq is not None  # the run applied those batches
            self._replay_lost(feed, pub, lost, pub.last_seq + 1)

    def _replay_lost(self, feed: _Feed, pub: _Publisher, lost: int, seq: int) -> None:
        """``lost`` replayed batches did not decode: the replay endpoint answered garbage for
        batches whose live copies we missed. Counted, and resynced at ``seq`` as an unrecoverable
        gap is (the worker's entries may lack stores and keep removed pages)."""
        log.warning("%s rank %d: the replay answered %d batch(es) that do not decode: lost, "
                    "resync", feed.info.worker_id, pub.rank, lost)
        self._counts["replay_lost"] += lost
        self._counts["replay_failures"] += 1
        self._resync(feed, pub, seq)

    async def _catch_up(self, feed: _Feed, pub: _Publisher) -> None:
        """Apply what the publisher still buffers from before we joined (seq 0 on). Live messages
        arriving meanwhile wait in the SUB socket and are skipped as duplicates."""
        assert pub.replay_endpoint is not None
        self._counts["replays"] += 1
        batches = await request_replay(self._ctx, pub.replay_endpoint, 0, self.replay_timeout_s)
        if batches is None:
            self._counts["replay_failures"] += 1
            return
        # a buffer that no longer holds seq 0 starts later: that history is lost anyway
        self._check_run(feed, pub, self._apply_run(pub, batches))

    async def _fill_gap(self, feed: _Feed, pub: _Publisher, seq: int) -> bool:
        """Replay the batches before ``seq``; True when the feed goes on at ``seq``: all of them
        were applied, or some did not decode and the worker was resynced here (:meth:`_replay_lost`,
        so the caller does not resync it twice). False: not covered, the caller resyncs."""
        if pub.replay_endpoint is None:
            return False
        start = 0 if pub.last_seq is None else pub.last_seq + 1
        self._counts["replays"] += 1
        batches = await request_replay(self._ctx, pub.replay_endpoint, start,
                                       self.replay_timeout_s)
        if batches is None:
            self._counts["replay_failures"] += 1
            return False
        lost = 0
        for s, payload in batches:
            if s < start or (pub.last_seq is not None and s <= pub.last_seq):
                continue
            if s != (0 if pub.last_seq is None else pub.last_seq + 1):
                break  # the publisher's buffer no longer holds what we missed
            pub.last_seq = s
            if s >= seq:
                pub.replayed = (seq, s)  # ahead of live: their live copies are duplicates
            lost += not self._apply(pub, payload)
        if lost:
            pub.replayed = None  # dropped with the rest: live copies from seq on are applied
            self._replay_lost(feed, pub, lost, seq)
            return True
        covered = pub.last_seq is not None and pub.last_seq >= seq - 1
        if not covered:
            self._counts["replay_failures"] += 1
        return covered
