"""The coordination link: one router's connection to the service its peers share (Redis).

Writes what this router admits (workers, drains, shared prefixes, aliases, profiles, its load),
reads what its peers wrote (a change notice per write on ``rg:<cluster>:changes``, and every
record again every ``resync_s``: what a complete read no longer finds is gone), and holds the
leader lease. Every record but an alias is listed in its kind's index set
(``rg:<cluster>:ids:<kind>``), so a resync reads ids and values, never the keyspace. Contract
(``docs/interfaces.md``, "Several routers, one view"):

* the service down or slow: a call gives up after 4 x ``op_timeout_s`` (each socket operation
  after ``op_timeout_s``); the router keeps routing on its last view, ``degraded`` is set,
  failures are counted per operation and logged once per outage; when the service answers
  again the router writes back what it owns, and the first two complete reads after that remove
  nothing (the other routers may not have written theirs back yet);
* a record that does not decode, is oversized, names another key or contradicts this router's
  state is refused (``reader.py``) and never reaches the router's state;
* a peer of another version or config digest: :class:`CoordinationConflict` at start (the
  router does not start), a counted error (logged once per peer) while running.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from radix_global.types import PageKey
from router.coordination import records as rec
from router.coordination.config import CoordinationConfig
from router.coordination.lease import Lease
from router.coordination.reader import Reader, SharedState
from router.coordination.records import Keys, Kind
from router.routing.link_fit import LinkStats
from router.routing.load_view import PeerLoads, SlotLoad
from router.routing.queue_model import Slot
from router.routing.topology import LinkKey

log = logging.getLogger("radix_global.router.coordination")
T = TypeVar("T")
R = TypeVar("R", bound=msgspec.Struct)
# profiles first: a worker joining here is priced with its fitted profile
RESYNCED = (Kind.PROFILE, Kind.WORKER, Kind.DRAIN, Kind.PREFIX, Kind.LOAD, Kind.LINK)
_ABSENT = object()


class CoordinationConflict(RuntimeError):
    """Another router of this cluster runs another version or config: they must not share."""


class Coordinator:
    def __init__(self, config: CoordinationConfig, router_id: str, version: str, digest: str,
                 shared: SharedState, own_load: Callable[[], Mapping[Slot, SlotLoad]],
                 clock: Callable[[], float] = time.monotonic,
                 own_links: Callable[[], Mapping[LinkKey, LinkStats]] = dict) -> None:
        assert config.url is not None
        self.config, self.router_id = config, router_id
        self.version, self.digest = version, digest
        self.shared, self.own_load, self.clock = shared, own_load, clock
        self.own_links = own_links
        self._links_published = b""
        self._links_cut = False  # logged that the links were more than a record holds
        self.keys = Keys(config.cluster)
        self.peers = PeerLoads(config.load_expire_s)
        self.reader = Reader(router_id, shared, self.peers, clock)
        self.redis = aioredis.Redis.from_url(
            config.url, socket_timeout=config.op_timeout_s,
            socket_connect_timeout=config.op_timeout_s)
        self.lease = Lease(self.redis, self.keys.key(Kind.LEASE, "leader"), router_id,
                           config.lease_s, clock)
        self.synced = False  # a first complete read is done
        self.degraded = False
        self._rejoin = False  # an outage happened: write back what this router owns
        # complete reads after a rejoin that remove nothing: every router writes back what it
        # owns in its first round after the service answers, which may come after another's
        # first read
        self._keep = 0
        self.errors: collections.Counter[str] = collections.Counter()  # per operation
        self.conflicts: set[str] = set()
        # publications are numbered from the wall clock: a restarted router's are newer
        self._seq = time.time_ns() // 1_000_000
        self._published: Mapping[Slot, SlotLoad] | None = None
        # prompts routed since the last publication: (slot, last page key), the newest last
        self._tips: collections.deque[tuple[Slot, PageKey]] = collections.deque(
            maxlen=rec.MAX_ROUTED_TIPS)
        self._published_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()

    @property
    def refused(self) -> collections.Counter[str]:
        return self.reader.refused

    # --- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Refuse to share with a router of another version or config, announce this one, take
        the lease if it is free, read everything, then follow changes. An unreachable service
        is not fatal: the router starts degraded, checks its peers and joins when the service
        answers."""
        try:
            await self._check_peers(at_start=True)
            await self._announce()
            await self.lease.renew()
            await self.resync()
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("start", exc)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._every(self.config.resync_s, self._resync_round)),
                       loop.create_task(self._every(self.config.lease_s / 3, self._renew)),
                       loop.create_task(self._follow())]
        if not self.config.unshared_load:
            self._tasks.append(loop.create_task(self._publishing()))

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._spawned]
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a connection that hangs in its close must not hold the shutdown
            await asyncio.wait(tasks, timeout=self.config.op_timeout_s * 4)
        self._tasks = []
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(self.config.op_timeout_s * 2):
                for kind in (Kind.ROUTER, Kind.LOAD, Kind.LINK):
                    await self._delete(kind, self.router_id)
                await self.lease.release()
                await self._notify(Kind.LOAD, self.router_id)
                if self._links_published:
                    await self._notify(Kind.LINK, self.router_id)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.op_timeout_s * 2):
                await self.redis.aclose()

    def changed(self) -> None:
        """This router's in-flight work changed: published at once, or when the rate bound
        (``load_publish_s``) lets it."""
        self._changed.set()

    def routed(self, slot: Slot, keys: Sequence[PageKey]) -> None:
        """A prompt of page ``keys`` was routed to ``slot``: its last key rides on the next
        publication (at most ``MAX_ROUTED_TIPS`` per publication, the oldest dropped)."""
        if keys and not self.config.unshared_load:  # published with the routing's change
            self._tips.append((slot, keys[-1]))

    def leads(self) -> bool:
        """Whether this router holds the leader lease now (runs the once-per-cluster jobs)."""
        return self.lease.held()

    def stats(self) -> dict[str, Any]:
        return {"router_id": self.router_id, "synced": self.synced, "degraded": self.degraded,
                "leader": self.leads(), "peers": self.peers.routers(),
                "errors": dict(self.errors), "refused": dict(self.refused),
                "conflicts": sorted(self.conflicts)}

    # --- writes and reads ----------------------------------------------------------------------

    async def put(self, kind: Kind, ident: str, value: bytes, ttl_s: float | None = None) -> bool:
        notice = rec.Notice(self.router_id, kind, ident).encode()
        return bool(await self._call(f"put_{kind}", self._put(kind, ident, value, ttl_s, notice)))

    async def _put(self, kind: Kind, ident: str, value: bytes, ttl_s: float | None,
                   notice: bytes | None = None) -> bool:
        """The record, its id in the kind's index and ``notice`` on the changes channel, in one
        round trip."""
        px = max(1, int(ttl_s * 1000)) if ttl_s is not None else None
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.key(kind, ident), value, px=px)
            if kind is not Kind.ALIAS:  # aliases are read on demand, never listed
                pipe.sadd(self.keys.index(kind), ident)
            if notice is not None:
                pipe.publish(self.keys.changes, notice)
            await pipe.execute()
        return True

    async def touch(self, kind: Kind, ident: str, ttl_s: float) -> bool | None:
        """Extend a record's time to live: False when it is gone, None when the service did
        not answer."""
        return await self._call(f"touch_{kind}", self.redis.pexpire(
            self.keys.key(kind, ident), max(1, int(ttl_s * 1000))))

    async def delete(self, kind: Kind, ident: str) -> None:
        if await self._call(f"delete_{kind}", self._delete(kind, ident)):
            await self._call("notify", self._notify(kind, ident))

    async def _delete(self, kind: Kind, ident: str) -> bool:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.key(kind, ident))
            pipe.srem(self.keys.index(kind), ident)
            await pipe.execute()
        return True

    async def get(self, kind: Kind, ident: str, record: type[R],
                  timeout_s: float | None = None) -> R | None:
        """One record read now (None: absent, refused, no answer within ``timeout_s``, or the
        service known down: a caller waiting on it must not wait for an outage)."""
        if self.degraded:
            return None
        raw = await self._get(kind, ident, timeout_s)
        if raw is _ABSENT or raw is None:
            return None
        return self.reader.decode(kind, ident, raw, record)

    async def _get(self, kind: Kind, ident: str, timeout_s: float | None = None) -> Any:
        """The raw value; :data:`_ABSENT` when there is none, None when the service failed."""
        raw = await self._call(f"get_{kind}", self.redis.get(self.keys.key(kind, ident)),
                               timeout_s)
        return _ABSENT if raw is None and not self.degraded else raw

    def spawn(self, write: Awaitable[Any]) -> None:
        """Run a write without waiting for it (the request path never waits for the service)."""
        task = asyncio.ensure_future(write)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    async def _notify(self, kind: Kind, ident: str) -> None:
        notice = rec.Notice(self.router_id, kind, ident)
        await self.redis.publish(self.keys.changes, notice.encode())

    async def resync(self) -> None:
        """Read every listed record and apply it; after a complete read of a kind, what is no
        longer there is gone. Raises the service's error (the callers count it)."""
        await self._check_peers(at_start=False)
        for kind in RESYNCED:
            found = await self._read_all(kind)
            for ident, raw in found.items():
                self.reader.apply(kind, ident, raw)
            if not self._keep:
                self.reader.present(kind, set(found))
        self._keep = max(0, self._keep - 1)
        self.synced = True

    async def _read_all(self, kind: Kind) -> dict[str, bytes | str]:
        members: set[bytes | str] = await self.redis.smembers(self.keys.index(kind))
        ids = sorted(i.decode(errors="replace") if isinstance(i, bytes) else i for i in members)
        out: dict[str, bytes | str] = {}
        stale: list[str] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            values = await self.redis.mget([self.keys.key(kind, x) for x in chunk])
            for ident, raw in zip(chunk, values, strict=True):
                if raw is None:
                    stale.append(ident)  # expired: its id leaves the index too
                else:
                    out[ident] = raw
        if stale:
            await self.redis.srem(self.keys.index(kind), *stale)
        return out

    async def _follow(self) -> None:
        """Change notices; reconnects after an outage (the resync covers what was missed)."""
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(self.keys.changes)
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            await self._notice(message.get("data"))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the service went away: wait, then subscribe again
                self._failed("follow", exc)
                await asyncio.sleep(self.config.resync_s)

    async def _notice(self, data: Any) -> None:
        try:
            notice = rec.parse_notice(data)
        except rec.RecordError as exc:  # logged once per writer and kind, not per message
            text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
            self.reader.refuse("notice", text.partition(":")[0][:120], exc)
            return
        kind, ident = notice.kind, notice.ident
        if notice.writer == self.router_id or kind not in RESYNCED:
            return  # its own; read on demand (aliases) or at the next resync (routers)
        if notice.inline and kind is Kind.LOAD:  # the peers' load comes with its notice
            self.reader.apply(kind, ident, notice.inline)
            return
        raw = await self._get(kind, ident)
        if raw is _ABSENT:
            self.reader.gone(kind, ident)
        elif raw is not None:
            self.reader.apply(kind, ident, raw)

    async def _check_peers(self, at_start: bool) -> None:
        for ident, raw in (await self._read_all(Kind.ROUTER)).items():
            peer = self.reader.decode(Kind.ROUTER, ident, raw, rec.RouterRecord)
            if peer is None or ident == self.router_id:
                continue
            if (peer.version, peer.config_digest) == (self.version, self.digest):
                self.conflicts.discard(ident)
                continue
            msg = (f"router {ident!r} of cluster {self.config.cluster!r} runs version "
                   f"{peer.version} with config digest {peer.config_digest}; this router runs "
                   f"{self.version} with {self.digest}: routers that decide differently must "
                   "not share a view (use another coordination_cluster)")
            if at_start:
                raise CoordinationConflict(msg)
            if ident not in self.conflicts:
                self.conflicts.add(ident)
                log.error("coordination: %s", msg)

    # --- periodic ----------------------------------------------------------------------------

    async def _announce(self) -> bool:
        record = rec.RouterRecord(rec.SCHEMA, self.router_id, self.version, self.digest)
        return await self._put(Kind.ROUTER, self.router_id, rec.encode(record),
                               self.config.resync_s * 3)

    async def _resync_round(self) -> None:
        if not await self._call("announce", self._announce()):
            return
        if self._rejoin:  # the service is back, maybe empty: write back what this router owns
            self._rejoin, self._keep = False, 2
            for kind, ident, value, ttl in self.shared.owned():
                await self._call(f"put_{kind}", self._put(kind, ident, value, ttl))
            log.warning("coordination service answers again: rejoined")
        await self._call("resync", self.resync(),
                         max(self.config.resync_s, self.config.op_timeout_s * 4))
        if not self.degraded:  # after the resync: a failed write must not fake a rejoin
            await self._call("put_link", self._publish_links())

    async def _publish_links(self) -> bool:
        """This router's measured links, every resync (their time to live is three), with a
        change notice when they changed; the most sampled ``MAX_LINKS`` of them (a record with
        more is refused by every peer)."""
        links = dict(self.own_links())
        if not links:
            return True
        if len(links) > rec.MAX_LINKS:
            if not self._links_cut:
                log.warning("coordination: %d measured links, sharing the %d most sampled",
                            len(links), rec.MAX_LINKS)
                self._links_cut = True
            links = dict(sorted(links.items(), key=lambda kv: -kv[1].samples)[:rec.MAX_LINKS])
        value = rec.encode(rec.link_record(self.router_id, links))
        notice = (rec.Notice(self.router_id, Kind.LINK, self.router_id).encode()
                  if value != self._links_published else None)
        await self._put(Kind.LINK, self.router_id, value, self.config.resync_s * 3, notice)
        self._links_published = value
        return True

    async def _publish(self) -> None:
        now = self.clock()
        loads = dict(self.own_load())
        ttl = self.config.load_expire_s
        unchanged = loads == self._published and not self._tips
        if unchanged and now - self._published_at < ttl / 3:
            return
        key = self.keys.key(Kind.LOAD, self.router_id)
        if unchanged and await self._call(
                "touch_load", self.redis.pexpire(key, int(ttl * 1000))):
            self._published_at = now
            return
        self._seq += 1
        tips = list(self._tips)
        self._tips.clear()  # best effort: a publication that fails loses them (events follow)
        value = rec.encode(rec.load_record(self.router_id, self._seq, loads, tips))
        # the record rides on its notice: peers publishing up to 50 times a second are
        # applied without a read each
        notice = rec.Notice(self.router_id, Kind.LOAD, self.router_id, value.decode()).encode()
        if await self._call("put_load", self._put(Kind.LOAD, self.router_id, value, ttl, notice)):
            self._published, self._published_at = loads, now

    async def _publishing(self) -> None:
        """Publish on change, at most every ``load_publish_s``; refresh the record's time to
        live while nothing changes."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.load_expire_s / 4):
                    await self._changed.wait()
            self._changed.clear()
            try:
                await self._publish()
            except Exception:  # one bad round must not stop the link
                log.exception("coordination: publishing the load failed")
            await asyncio.sleep(self.config.load_publish_s)

    async def _renew(self) -> None:
        await self._call("lease", self.lease.renew())

    async def _every(self, period_s: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not stop the link
                log.exception("coordination round %s failed", getattr(fn, "__name__", fn))

    async def _call(self, op: str, aw: Awaitable[T], timeout_s: float | None = None
                    ) -> T | None:
        """``aw`` within ``timeout_s`` (default 4 x ``op_timeout_s``); None (counted, degraded)
        when the service fails."""
        try:
            async with asyncio.timeout(timeout_s or self.config.op_timeout_s * 4):
                out = await aw
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(op, exc)
            return None
        self.degraded = False
        return out

    def _failed(self, op: str, exc: BaseException) -> None:
        self.errors[op] += 1
        self._rejoin = True
        if not self.degraded:
            log.warning("coordination service failed (%s: %r): routing on the last view until "
                        "it answers", op, exc)
        self.degraded = True
