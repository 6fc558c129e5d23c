"""Between the coordination link and one router's state: what peers wrote is applied to this
router's registry, shared prefixes and prefill profiles (:class:`SharedView`, the link's
:class:`~router.coordination.link.SharedState`), and what this router admits is written for its
peers (:class:`SharedWrites`).

Liveness of a worker another router admitted: its record lives while whoever receives its
heartbeat (or passes its health check) refreshes the record's time to live; every router that
reads the record counts that as a heartbeat, and a record that expired stops refreshing it, so the
worker leaves every registry ``heartbeat_timeout_s`` after its last heartbeat anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from radix_global.registration import encode_worker_info
from radix_global.types import Namespace, PageKey, WorkerId
from router.cluster.registry import RegistryError, Source, WorkerEntry, WorkerRegistry
from router.coordination import records as rec
from router.coordination.link import Coordinator
from router.coordination.records import Kind, RecordError
from router.keying.alias_book import AliasBook, AliasEntry
from router.keying.prefix_specs import PrefixSpec, SharedPrefixError, parse_spec
from router.keying.shared_prefixes import SharedPrefixes

log = logging.getLogger("radix_global.router.coordination")

ProfileSink = Callable[[WorkerEntry, tuple[float, ...]], None]
ALIAS_TTL_S = 24 * 3600.0  # a recorded chain head is asked again within a day or forgotten


def alias_id(namespace: Namespace, head: PageKey) -> str:
    return f"{namespace}:{head}"


def worker_record(entry: WorkerEntry) -> bytes:
    return rec.encode(rec.WorkerRecord(
        rec.SCHEMA, encode_worker_info(entry.info).decode(), entry.model_path,
        entry.context_length, dict(entry.lora)))


class SharedView:
    """Applies peers' records to this router (see the module docstring)."""

    def __init__(self, registry: WorkerRegistry, prefixes: SharedPrefixes,
                 forget_aliases: Callable[[str], None], profile: ProfileSink,
                 clock: Callable[[], float], heartbeat_ttl_s: float) -> None:
        self.registry, self.prefixes = registry, prefixes
        self.forget_aliases, self.profile, self.clock = forget_aliases, profile, clock
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.admitted: dict[str, bytes] = {}  # worker id -> its record, admitted here
        self.registered: dict[str, PrefixSpec] = {}  # prefixes registered through this router
        self.applying = False  # adding a worker a peer admitted: not this router's to write
        # fitted profiles read from the service, for workers that join later
        self.profiles: dict[tuple[str, str], tuple[float, ...]] = {}

    def worker_seen(self, record: rec.WorkerRecord, ident: str) -> None:
        info = rec.worker_info(record, ident)
        entry = self.registry.find(ident)
        if entry is not None and entry.info == info:
            self.registry.heartbeat(ident, self.clock())
            return
        self.applying = True
        try:
            self.registry.add(info, Source.REGISTERED, self.clock(),
                              model_path=record.model_path,
                              context_length=record.context_length, lora=record.lora)
        except RegistryError as exc:  # contradicts what this router knows (page size, ids)
            raise RecordError(f"worker {ident!r}: {exc}") from None
        finally:
            self.applying = False
        log.info("worker %s joined through the coordination service", ident)

    def worker_gone(self, worker_id: str) -> None:
        if self.registry.find(worker_id) is not None:
            self.registry.remove(worker_id)
            log.info("worker %s removed through the coordination service", worker_id)
        self.admitted.pop(worker_id, None)

    def drained(self, worker_id: str) -> None:
        entry = self.registry.find(worker_id)
        if entry is not None:
            entry.draining = True

    def undrained(self, worker_id: str) -> None:
        entry = self.registry.find(worker_id)
        if entry is not None:
            entry.draining = False

    def prefix_seen(self, record: rec.PrefixRecord) -> None:
        try:
            spec = parse_spec(record.name, record.spec)
        except SharedPrefixError as exc:
            raise RecordError(f"prefix {record.name!r}: {exc}") from None
        known = {s.name: s for s in self.prefixes.specs()}.get(spec.name)
        if known == spec:
            return
        if known is not None:  # re-registered with another text: the new one replaces it
            self.prefix_gone(spec.name)
        try:
            self.prefixes.add(spec)  # tokenized when the first request of its model comes
        except SharedPrefixError as exc:
            raise RecordError(f"prefix {spec.name!r}: {exc}") from None

    def prefix_gone(self, name: str) -> None:
        if self.prefixes.remove(name):
            self.forget_aliases(name)
        self.registered.pop(name, None)

    def profile_seen(self, record: rec.ProfileRecord) -> None:
        coef = tuple(record.coef)
        if self.profiles.get((record.worker_id, record.namespace)) == coef:
            return
        if len(self.profiles) < 65536:
            self.profiles[(record.worker_id, record.namespace)] = coef
        entry = self.registry.find(record.worker_id)
        if entry is not None and entry.info.namespace == record.namespace:
            self.profile(entry, coef)

    def owned(self) -> list[tuple[Kind, str, bytes, float | None]]:
        out: list[tuple[Kind, str, bytes, float | None]] = [
            (Kind.WORKER, wid, value, self.heartbeat_ttl_s)
            for wid, value in self.admitted.items() if self.registry.find(wid) is not None]
        out += [(Kind.PREFIX, name, rec.encode(rec.PrefixRecord(rec.SCHEMA, name, spec.to_json())),
                 None) for name, spec in self.registered.items()]
        return out


class SharedWrites:
    """What this router admits, written for its peers. Every method returns at once: the
    writes run in the background (:meth:`Coordinator.spawn`), the request and admin paths never
    wait for the service."""

    def __init__(self, link: Coordinator, view: SharedView) -> None:
        self.link, self.view = link, view

    def worker_admitted(self, entry: WorkerEntry) -> None:
        value = self.view.admitted[entry.info.worker_id] = worker_record(entry)
        self.link.spawn(self.link.put(Kind.WORKER, entry.info.worker_id, value,
                                      self.view.heartbeat_ttl_s))
        self.link.spawn(self.link.delete(Kind.DRAIN, entry.info.worker_id))

    def worker_alive(self, worker_id: str) -> None:
        """A heartbeat or a passed health check here: the record lives on (written again when
        it expired meanwhile, e.g. the service restarted empty)."""
        self.link.spawn(self._alive(worker_id))

    async def _alive(self, worker_id: str) -> None:
        touched = await self.link.touch(Kind.WORKER, worker_id, self.view.heartbeat_ttl_s)
        value = self.view.admitted.get(worker_id)
        if touched is False and value is None:
            entry = self.view.registry.find(worker_id)
            value = worker_record(entry) if entry is not None else None
        if touched is False and value is not None:
            await self.link.put(Kind.WORKER, worker_id, value, self.view.heartbeat_ttl_s)

    def worker_removed(self, worker_id: WorkerId | str) -> None:
        self.view.admitted.pop(worker_id, None)
        self.link.spawn(self.link.delete(Kind.WORKER, worker_id))

    def worker_drained(self, worker_id: str) -> None:
        self.link.spawn(self.link.put(Kind.DRAIN, worker_id,
                                      rec.encode(rec.DrainRecord(rec.SCHEMA, worker_id)),
                                      None))

    def prefix_added(self, spec: PrefixSpec) -> None:
        self.view.registered[spec.name] = spec
        self.link.spawn(self.link.put(Kind.PREFIX, spec.name, rec.encode(
            rec.PrefixRecord(rec.SCHEMA, spec.name, spec.to_json()))))

    def prefix_removed(self, name: str) -> None:
        self.view.registered.pop(name, None)
        self.link.spawn(self.link.delete(Kind.PREFIX, name))

    def profile_fitted(self, worker_id: str, namespace: str, coef: tuple[float, ...]) -> None:
        self.link.spawn(self.link.put(Kind.PROFILE, f"{worker_id}:{namespace}", rec.encode(
            rec.ProfileRecord(rec.SCHEMA, worker_id, namespace, list(coef)))))

    def alias_recorded(self, aliases: AliasBook, namespace: Namespace, head: PageKey) -> None:
        entries = [rec.AliasItem(e.name, e.salt, e.page_size, list(e.tokens))
                   for e in aliases.entries(namespace, head)]
        self.link.spawn(self.link.put(Kind.ALIAS, alias_id(namespace, head), rec.encode(
            rec.AliasRecord(rec.SCHEMA, entries)), ALIAS_TTL_S))

    async def alias_lookup(self, aliases: AliasBook, namespace: Namespace, head: PageKey) -> bool:
        """Adopt what another router recorded under ``head``; True when something was."""
        record = await self.link.get(Kind.ALIAS, alias_id(namespace, head), rec.AliasRecord)
        if record is None:
            return False
        known = {s.name for s in self.view.prefixes.specs()}
        for e in record.entries:
            if e.name in known and e.page_size > 0:  # a prefix since removed gives no aliases
                aliases.adopt(namespace, head, AliasEntry(e.name, e.salt, tuple(e.tokens),
                                                          e.page_size))
        return bool(aliases.entries(namespace, head))
