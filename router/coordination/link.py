"""The coordination link: one router's connection to the service its peers share (Redis).

Writes what this router admits (workers, drains, shared prefixes, aliases, profiles, its load),
reads what its peers wrote (a change notice per write on ``rg:<cluster>:changes``, and everything
again every ``resync_s``), and holds the leader lease of once-per-cluster jobs. What is read is
handed to a :class:`SharedState` (the router). Contract (``docs/interfaces.md``, "Several
routers, one view"):

* the service down or slow: every call gives up after ``op_timeout_s``; the router keeps
  routing on its last view, ``degraded`` is set, failures are counted per operation and logged
  once per outage; when the service answers again the router writes back what it owns (its
  workers' records, its prefixes) and re-reads everything;
* a record that does not decode, is oversized or names another key is refused (counted per
  kind, logged once per key) and never reaches the router's state;
* a peer of another version or config digest: :class:`CoordinationConflict` at start (the
  router exits), a counted error while running.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.coordination import records as rec
from router.coordination.config import CoordinationConfig
from router.coordination.records import Keys, Kind, RecordError
from router.routing.load_view import PeerLoads, SlotLoad
from router.routing.queue_model import Slot

log = logging.getLogger("radix_global.router.coordination")
T = TypeVar("T")
R = TypeVar("R", bound=msgspec.Struct)
LEADER = "leader"
# renew the lease only while this router still holds it
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then " \
         "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"


class CoordinationConflict(RuntimeError):
    """Another router of this cluster runs another version or config: they must not share."""


class SharedState(Protocol):
    """What the link hands to the router. Each call is one record read from the service."""

    def worker_seen(self, record: rec.WorkerRecord, ident: str) -> None: ...
    def worker_gone(self, worker_id: str) -> None: ...
    def drained(self, worker_id: str) -> None: ...
    def undrained(self, worker_id: str) -> None: ...
    def prefix_seen(self, record: rec.PrefixRecord) -> None: ...
    def prefix_gone(self, name: str) -> None: ...
    def profile_seen(self, record: rec.ProfileRecord) -> None: ...
    def owned(self) -> list[tuple[Kind, str, bytes, float | None]]:
        """Records this router owns, rewritten after an outage: (kind, id, value, ttl_s)."""
        ...


class Coordinator:
    def __init__(self, config: CoordinationConfig, router_id: str, version: str, digest: str,
                 shared: SharedState, own_load: Callable[[], Mapping[Slot, SlotLoad]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert config.url is not None
        self.config, self.router_id = config, router_id
        self.version, self.digest = version, digest
        self.shared, self.own_load, self.clock = shared, own_load, clock
        self.keys = Keys(config.cluster)
        self.peers = PeerLoads(config.load_expire_s)
        self.redis = aioredis.Redis.from_url(
            config.url, socket_timeout=config.op_timeout_s,
            socket_connect_timeout=config.op_timeout_s)
        self.synced = False  # the first full read is done
        self.degraded = False
        self._rejoin = False  # an outage happened: write back what this router owns
        self.errors: collections.Counter[str] = collections.Counter()  # per operation
        self.refused: collections.Counter[str] = collections.Counter()  # per record kind
        self.conflicts = 0
        self._refused_keys: set[str] = set()
        self._lease_until = 0.0
        # publications are numbered from the wall clock: a restarted router's are newer
        self._seq = time.time_ns() // 1_000_000
        self._published: Mapping[Slot, SlotLoad] | None = None
        self._published_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[Any]] = set()

    # --- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Refuse to share with a router of another version or config, announce this one, read
        everything, then follow changes. An unreachable service is not fatal: the router starts
        degraded and joins when the service answers."""
        try:
            await self._check_peers(at_start=True)
            await self._announce()
            await self.resync()
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("start", exc)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._every(self.config.resync_s, self._resync_round)),
                       loop.create_task(self._every(self.config.load_publish_s, self._publish)),
                       loop.create_task(self._every(self.config.lease_s / 3, self._lease)),
                       loop.create_task(self._follow())]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._spawned]
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a connection that hangs in its close must not hold the shutdown
            await asyncio.wait(tasks, timeout=self.config.op_timeout_s * 4)
        self._tasks = []
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(self.config.op_timeout_s * 2):
                await self.redis.delete(self.keys.key(Kind.ROUTER, self.router_id),
                                        self.keys.key(Kind.LOAD, self.router_id))
                if self.leads():
                    await self.redis.delete(self.keys.key(Kind.LEASE, LEADER))
                await self._notify(Kind.LOAD, self.router_id)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.op_timeout_s * 2):
                await self.redis.aclose()

    def leads(self) -> bool:
        """Whether this router holds the leader lease now (runs the once-per-cluster jobs)."""
        return self.clock() < self._lease_until

    def stats(self) -> dict[str, Any]:
        return {"router_id": self.router_id, "synced": self.synced, "degraded": self.degraded,
                "leader": self.leads(), "peers": self.peers.routers(),
                "errors": dict(self.errors), "refused": dict(self.refused),
                "conflicts": self.conflicts}

    # --- writes ------------------------------------------------------------------------------

    async def put(self, kind: Kind, ident: str, value: bytes, ttl_s: float | None = None) -> bool:
        key = self.keys.key(kind, ident)
        ok = await self._call(f"put_{kind}", self._put(key, value, ttl_s))
        if ok:
            await self._call("notify", self._notify(kind, ident))
        return bool(ok)

    async def _put(self, key: str, value: bytes, ttl_s: float | None) -> bool:
        px = max(1, int(ttl_s * 1000)) if ttl_s is not None else None
        await self.redis.set(key, value, px=px)
        return True

    async def touch(self, kind: Kind, ident: str, ttl_s: float) -> bool | None:
        """Extend a record's time to live: False when it is gone (the caller writes it again),
        None when the service did not answer."""
        return await self._call(f"touch_{kind}", self.redis.pexpire(
            self.keys.key(kind, ident), max(1, int(ttl_s * 1000))))

    async def delete(self, kind: Kind, ident: str) -> None:
        if await self._call(f"delete_{kind}", self.redis.delete(self.keys.key(kind, ident))):
            await self._call("notify", self._notify(kind, ident))

    async def get(self, kind: Kind, ident: str, record: type[R]) -> R | None:
        """One record read now (None: absent, refused or no answer)."""
        raw = await self._call(f"get_{kind}", self.redis.get(self.keys.key(kind, ident)))
        return self._decode(kind, ident, raw, record) if raw is not None else None

    def spawn(self, write: Awaitable[Any]) -> None:
        """Run a write without waiting for it (the request path never waits for the service)."""
        task = asyncio.ensure_future(write)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    async def _notify(self, kind: Kind, ident: str) -> None:
        await self.redis.publish(self.keys.changes, f"{self.router_id} {kind}:{ident}")

    # --- reads -------------------------------------------------------------------------------

    async def resync(self) -> None:
        """Read every record; raises the service's error (the callers count it)."""
        await self._check_peers(at_start=False)
        # profiles before workers: a worker joining here is priced with its fitted profile
        for kind in (Kind.PROFILE, Kind.WORKER, Kind.DRAIN, Kind.PREFIX, Kind.LOAD):
            for _, ident, raw in await self._scan(kind):
                self._apply(kind, ident, raw)
        live = {i for _, i, _ in await self._scan(Kind.LOAD)}
        for rid in self.peers.routers():
            if rid not in live:
                self.peers.drop(rid)
        self.peers.expire(self.clock())
        self.synced = True

    async def _scan(self, kind: Kind) -> list[tuple[Kind, str, bytes | str]]:
        keys = [k async for k in self.redis.scan_iter(match=self.keys.pattern(kind), count=500)]
        out: list[tuple[Kind, str, bytes | str]] = []
        for i in range(0, len(keys), 500):
            chunk = keys[i:i + 500]
            for key, raw in zip(chunk, await self.redis.mget(chunk), strict=True):
                if raw is None:
                    continue  # expired between the scan and the read
                try:
                    _, ident = self.keys.split(key.decode(errors="replace"))
                except RecordError as exc:
                    self._refuse(kind, str(key), exc)
                    continue
                out.append((kind, ident, raw))
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
        text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        writer, _, name = text.partition(" ")
        if writer == self.router_id:
            return
        kind_text, _, ident = name.partition(":")
        try:
            kind = Kind(kind_text)
        except ValueError:
            self._refuse(Kind.ROUTER, text[:120], RecordError(f"unknown notice {text[:120]!r}"))
            return
        if kind in (Kind.ROUTER, Kind.LEASE, Kind.ALIAS) or not ident:
            return  # read on demand (aliases) or at the next resync (routers)
        raw = await self._call(f"get_{kind}", self.redis.get(self.keys.key(kind, ident)))
        if raw is None and not self.degraded:
            self._gone(kind, ident)
        elif raw is not None:
            self._apply(kind, ident, raw)

    def _apply(self, kind: Kind, ident: str, raw: bytes | str) -> None:
        try:
            self._apply_record(kind, ident, raw)
        except RecordError as exc:  # decoded, but contradicts this router's state
            self._refuse(kind, ident, exc)

    def _apply_record(self, kind: Kind, ident: str, raw: bytes | str) -> None:
        if kind is Kind.WORKER:
            worker = self._decode(kind, ident, raw, rec.WorkerRecord)
            if worker is not None:
                self.shared.worker_seen(worker, ident)
        elif kind is Kind.DRAIN:
            if self._decode(kind, ident, raw, rec.DrainRecord) is not None:
                self.shared.drained(ident)
        elif kind is Kind.PREFIX:
            prefix = self._decode(kind, ident, raw, rec.PrefixRecord)
            if prefix is not None:
                self.shared.prefix_seen(prefix)
        elif kind is Kind.PROFILE:
            profile = self._decode(kind, ident, raw, rec.ProfileRecord, check_id=False)
            if profile is not None:
                self.shared.profile_seen(profile)
        elif kind is Kind.LOAD and ident != self.router_id:
            load = self._decode(kind, ident, raw, rec.LoadRecord)
            try:
                slots = rec.load_slots(load) if load is not None else None
            except RecordError as exc:
                self._refuse(kind, ident, exc)
                slots = None
            if load is not None and slots is not None and not self.peers.update(
                    ident, load.seq, slots, self.clock()):
                self.peers.refreshed(ident, self.clock())

    def _gone(self, kind: Kind, ident: str) -> None:
        if kind is Kind.WORKER:
            self.shared.worker_gone(ident)
        elif kind is Kind.DRAIN:
            self.shared.undrained(ident)
        elif kind is Kind.PREFIX:
            self.shared.prefix_gone(ident)
        elif kind is Kind.LOAD:
            self.peers.drop(ident)

    def _decode(self, kind: Kind, ident: str, raw: bytes | str, record: type[R],
                check_id: bool = True) -> R | None:
        try:
            out = rec.decode(raw, record, ident if check_id else None)
            if isinstance(out, rec.WorkerRecord):
                rec.worker_info(out, ident)
            return out
        except RecordError as exc:
            self._refuse(kind, ident, exc)
            return None

    def _refuse(self, kind: Kind, ident: str, exc: Exception) -> None:
        self.refused[str(kind)] += 1
        key = f"{kind}:{ident[:120]}"
        if key not in self._refused_keys and len(self._refused_keys) < 4096:
            self._refused_keys.add(key)
            log.error("coordination: refused record %s: %s", key, exc)

    async def _check_peers(self, at_start: bool) -> None:
        for _, ident, raw in await self._scan(Kind.ROUTER):
            peer = self._decode(Kind.ROUTER, ident, raw, rec.RouterRecord)
            if peer is None or ident == self.router_id:
                continue
            if (peer.version, peer.config_digest) != (self.version, self.digest):
                self.conflicts += 1
                msg = (f"router {ident!r} of cluster {self.config.cluster!r} runs version "
                       f"{peer.version} with config digest {peer.config_digest}; this router "
                       f"runs {self.version} with {self.digest}: routers that decide "
                       "differently must not share a view (use another coordination_cluster)")
                if at_start:
                    raise CoordinationConflict(msg)
                log.error("coordination: %s", msg)

    # --- periodic ----------------------------------------------------------------------------

    async def _announce(self) -> bool:
        record = rec.RouterRecord(rec.SCHEMA, self.router_id, self.version, self.digest)
        await self.redis.set(self.keys.key(Kind.ROUTER, self.router_id), rec.encode(record),
                             px=int(self.config.resync_s * 3000))
        return True

    async def _resync_round(self) -> None:
        if not await self._call("announce", self._announce()):
            return
        if self._rejoin:  # the service is back, maybe empty: write back what this router owns
            self._rejoin = False
            for kind, ident, value, ttl in self.shared.owned():
                await self._call(f"put_{kind}", self._put(self.keys.key(kind, ident), value,
                                                          ttl))
            log.warning("coordination service answers again: rejoined")
        await self._call("resync", self.resync())

    async def _publish(self) -> None:
        now = self.clock()
        loads = dict(self.own_load())
        ttl = self.config.load_expire_s
        if loads == self._published and now - self._published_at < ttl / 3:
            return
        key = self.keys.key(Kind.LOAD, self.router_id)
        if loads == self._published and await self._call(
                "touch_load", self.redis.pexpire(key, int(ttl * 1000))):
            self._published_at = now
            return
        self._seq += 1
        value = rec.encode(rec.load_record(self.router_id, self._seq, loads))
        if await self._call("put_load", self._put(key, value, ttl)):
            self._published, self._published_at = loads, now
            await self._call("notify", self._notify(Kind.LOAD, self.router_id))

    async def _lease(self) -> None:
        key, ms = self.keys.key(Kind.LEASE, LEADER), int(self.config.lease_s * 1000)
        start = self.clock()
        held = await self._call("lease", self.redis.eval(_RENEW, 1, key, self.router_id, ms)) \
            if self.leads() else None
        if not held:
            held = await self._call("lease", self.redis.set(key, self.router_id, nx=True, px=ms))
            if held:
                log.info("coordination: router %s leads cluster %s", self.router_id,
                         self.config.cluster)
        # counted from before the call: the lease may have been granted at its start
        self._lease_until = start + self.config.lease_s * 0.9 if held else 0.0

    async def _every(self, period_s: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not stop the link
                log.exception("coordination round %s failed", getattr(fn, "__name__", fn))

    async def _call(self, op: str, aw: Awaitable[T]) -> T | None:
        """``aw`` within ``op_timeout_s``; None (counted, degraded) when the service fails."""
        try:
            async with asyncio.timeout(self.config.op_timeout_s * 4):
                out = await aw
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(op, exc)
            return None
        if self.degraded:
            self.degraded = False
        return out

    def _failed(self, op: str, exc: BaseException) -> None:
        self.errors[op] += 1
        self._rejoin = True
        if not self.degraded:
            log.warning("coordination service failed (%s: %r): routing on the last view until "
                        "it answers", op, exc)
        self.degraded = True
