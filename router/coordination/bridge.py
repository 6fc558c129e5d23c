"""Between the coordination link and one router's state: what peers wrote is applied to this
router's registry, shared prefixes and prefill profiles (:class:`SharedView`, the link's
:class:`~router.coordination.reader.SharedState`), and what this router admits is written for
its peers (:class:`SharedWrites`).

Liveness, with a service: a worker (but a router's own command-line ones, health-checked) is
in a router's registry while its record is in the service. Whoever receives its heartbeat (or
passes its health check) extends the record's time to live; a record that expired is missing
from the next complete read, and the worker leaves every router (``heartbeat_timeout_s`` + one
resync after its last heartbeat anywhere). The router that admitted a worker, or that its
heartbeats reach now, owns its record: it writes the record again when it is gone, and its
removal is written for every router.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from radix_global.registration import encode_worker_info
from radix_global.types import Namespace, PageKey
from router.cluster.registry import RegistryError, Source, WorkerEntry, WorkerRegistry
from router.coordination import records as rec
from router.coordination.link import Coordinator
from router.coordination.records import Kind, RecordError
from router.keying.alias_book import AliasBook, AliasEntry
from router.keying.prefix_specs import PrefixSpec, SharedPrefixError, parse_spec
from router.keying.shared_prefixes import SharedPrefixes
from router.routing.link_fit import LinkStats
from router.routing.topology import LinkKey

log = logging.getLogger("radix_global.router.coordination")

ProfileSink = Callable[[WorkerEntry, tuple[float, ...]], None]


class LinkSink(Protocol):
    """Where measured links go and come from (``router/cluster/places.py::Places``)."""

    def own_links(self) -> dict[LinkKey, LinkStats]: ...
    def share(self, router: str, links: dict[LinkKey, LinkStats]) -> None: ...
    def unshare(self, router: str) -> None: ...

ALIAS_TTL_S = 24 * 3600.0  # a recorded chain head is asked again within a day or forgotten
ALIAS_LOOKUP_S = 0.3  # below the 0.5 s a worker's pool backend waits for the answer
MAX_PROFILES = 65536
MAX_LINK_ROUTERS = 256  # routers whose measured links count here


def alias_id(namespace: Namespace, head: PageKey) -> str:
    return f"{namespace}:{head}"


def worker_record(entry: WorkerEntry) -> bytes:
    return rec.encode(rec.WorkerRecord(
        rec.SCHEMA, encode_worker_info(entry.info).decode(), entry.model_path,
        entry.context_length, dict(entry.lora)))


def prefix_record(spec: PrefixSpec) -> bytes:
    return rec.encode(rec.PrefixRecord(rec.SCHEMA, spec.name, spec.to_json()))


def drain_record(worker_id: str) -> bytes:
    return rec.encode(rec.DrainRecord(rec.SCHEMA, worker_id))


class SharedView:
    """Applies peers' records to this router (see the module docstring)."""

    def __init__(self, registry: WorkerRegistry, prefixes: SharedPrefixes,
                 forget_aliases: Callable[[str], None], profile: ProfileSink,
                 clock: Callable[[], float], heartbeat_ttl_s: float,
                 links: LinkSink | None = None) -> None:
        self.registry, self.prefixes, self.links = registry, prefixes, links
        self.forget_aliases, self.profile, self.clock = forget_aliases, profile, clock
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.admitted: dict[str, bytes] = {}  # worker id -> its record, admitted here
        self.admitted_at: dict[str, float] = {}  # when (its record's write may be under way)
        self.registered: dict[str, PrefixSpec] = {}  # prefixes registered through this router
        self.drains: set[str] = set()  # drains issued here
        self.taken_prefixes: set[str] = set()  # prefixes taken from the service
        self.taken_drains: set[str] = set()  # drains taken from the service
        # fitted profiles read from the service, for workers that join later
        self.profiles: dict[tuple[str, str], tuple[float, ...]] = {}
        self.taken_links: set[str] = set()  # routers whose measured links count here

    def worker_seen(self, record: rec.WorkerRecord, ident: str) -> None:
        info = rec.worker_info(record, ident)
        entry = self.registry.find(ident)
        if entry is not None and entry.info == info:
            self.registry.heartbeat(ident, self.clock())
            return
        if entry is not None and entry.source is Source.CLI:  # this router's own, checked here
            raise RecordError(f"worker {ident!r} is on this router's command line with "
                              "another record")
        try:
            self.registry.add(info, Source.SHARED, self.clock(), model_path=record.model_path,
                              context_length=record.context_length, lora=record.lora)
        except RegistryError as exc:  # contradicts what this router knows (page size, ids)
            raise RecordError(f"worker {ident!r}: {exc}") from None
        log.info("worker %s joined through the coordination service", ident)

    def worker_gone(self, worker_id: str) -> None:
        entry = self.registry.find(worker_id)
        if entry is not None and entry.source is not Source.CLI:
            self.registry.remove(worker_id)
            log.info("worker %s removed through the coordination service", worker_id)
        self.admitted.pop(worker_id, None)
        self.admitted_at.pop(worker_id, None)

    def drained(self, worker_id: str) -> None:
        if self.registry.find(worker_id) is not None:
            self.registry.set_draining(worker_id, True)
            self.taken_drains.add(worker_id)

    def undrained(self, worker_id: str) -> None:
        if self.registry.find(worker_id) is not None:
            self.registry.set_draining(worker_id, False)
        self.taken_drains.discard(worker_id)

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
        self.taken_prefixes.add(spec.name)

    def prefix_gone(self, name: str) -> None:
        if self.prefixes.remove(name):
            self.forget_aliases(name)
        self.registered.pop(name, None)
        self.taken_prefixes.discard(name)

    def profile_seen(self, record: rec.ProfileRecord) -> None:
        key, coef = (record.worker_id, record.namespace), tuple(record.coef)
        if self.profiles.get(key) == coef:
            return
        if key in self.profiles or len(self.profiles) < MAX_PROFILES:
            self.profiles[key] = coef
        entry = self.registry.find(record.worker_id)
        if entry is not None and entry.info.namespace == record.namespace:
            self.profile(entry, coef)

    def links_seen(self, router_id: str, links: dict[LinkKey, LinkStats]) -> None:
        if self.links is not None:
            if router_id not in self.taken_links and len(self.taken_links) >= MAX_LINK_ROUTERS:
                raise RecordError(f"links of {router_id[:120]!r}: already {MAX_LINK_ROUTERS} "
                                  "routers' links")
            self.taken_links.add(router_id)
            self.links.share(router_id, links)

    def links_gone(self, router_id: str) -> None:
        if self.links is not None and router_id in self.taken_links:
            self.taken_links.discard(router_id)
            self.links.unshare(router_id)

    def present(self, kind: Kind, ids: set[str]) -> None:
        if kind is Kind.WORKER:
            # every worker but this router's command-line ones lives by its record: one whose
            # record expired had no heartbeat anywhere for heartbeat_timeout_s
            grace = self.clock() - self.heartbeat_ttl_s / 2
            for entry in self.registry.all():
                wid = entry.info.worker_id
                if (entry.source is not Source.CLI and wid not in ids
                        and self.admitted_at.get(wid, grace) <= grace):
                    self.worker_gone(wid)
        elif kind is Kind.DRAIN:
            for worker_id in self.taken_drains - ids:
                self.undrained(worker_id)
        elif kind is Kind.PREFIX:
            for name in self.taken_prefixes - ids:
                self.prefix_gone(name)
        elif kind is Kind.LINK:
            for router_id in self.taken_links - ids:
                self.links_gone(router_id)

    def owned(self) -> list[tuple[Kind, str, bytes, float | None]]:
        out: list[tuple[Kind, str, bytes, float | None]] = [
            (Kind.WORKER, wid, value, self.heartbeat_ttl_s)
            for wid, value in self.admitted.items() if self.registry.find(wid) is not None]
        out += [(Kind.PREFIX, name, prefix_record(spec), None)
                for name, spec in self.registered.items()]
        out += [(Kind.DRAIN, wid, drain_record(wid), None) for wid in self.drains]
        return out


class SharedWrites:
    """What this router admits, written for its peers. Every method returns at once: the
    writes run in the background (:meth:`Coordinator.spawn`), the request and admin paths never
    wait for the service."""

    def __init__(self, link: Coordinator, view: SharedView) -> None:
        self.link, self.view = link, view

    def worker_admitted(self, entry: WorkerEntry) -> None:
        wid = entry.info.worker_id
        value = self.view.admitted[wid] = worker_record(entry)
        self.view.admitted_at[wid] = self.view.clock()
        self.view.drains.discard(wid)
        self.link.spawn(self._admitted(wid, value))

    async def _admitted(self, worker_id: str, value: bytes) -> None:
        # in this order: a drain that follows the registration must not be undone by it
        await self.link.put(Kind.WORKER, worker_id, value, self.view.heartbeat_ttl_s)
        await self.link.delete(Kind.DRAIN, worker_id)

    def worker_alive(self, worker_id: str) -> None:
        """A heartbeat or a passed health check here: the record lives on. The router the
        worker talks to owns its record from then on (the one that admitted it may be gone):
        it writes it again when it expired meanwhile or the service came back empty. A worker
        removed by an operator while it still heartbeats comes back so, as it always did with
        one router (a heartbeat answered 404 registers it again)."""
        if worker_id not in self.view.admitted:
            entry = self.view.registry.find(worker_id)
            if entry is None:
                return
            self.view.admitted[worker_id] = worker_record(entry)
        self.link.spawn(self._alive(worker_id))

    async def _alive(self, worker_id: str) -> None:
        touched = await self.link.touch(Kind.WORKER, worker_id, self.view.heartbeat_ttl_s)
        value = self.view.admitted.get(worker_id)
        if touched is False and value is not None:
            await self.link.put(Kind.WORKER, worker_id, value, self.view.heartbeat_ttl_s)

    def worker_removed(self, worker_id: str) -> None:
        self.view.admitted.pop(worker_id, None)
        self.view.admitted_at.pop(worker_id, None)
        self.view.drains.discard(worker_id)
        self.link.spawn(self._removed(worker_id))

    async def _removed(self, worker_id: str) -> None:
        await self.link.delete(Kind.WORKER, worker_id)
        await self.link.delete(Kind.DRAIN, worker_id)

    def owns(self, worker_id: str) -> bool:
        return worker_id in self.view.admitted

    def worker_drained(self, worker_id: str) -> None:
        self.view.drains.add(worker_id)
        self.link.spawn(self.link.put(Kind.DRAIN, worker_id, drain_record(worker_id)))

    def prefix_added(self, spec: PrefixSpec) -> None:
        self.view.registered[spec.name] = spec
        self.link.spawn(self.link.put(Kind.PREFIX, spec.name, prefix_record(spec)))

    def prefix_removed(self, name: str) -> None:
        self.view.registered.pop(name, None)
        self.view.taken_prefixes.discard(name)
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
        """Adopt what another router recorded under ``head``; True when something was. Bounded
        below the asking worker's own timeout, and skipped while the service is down."""
        record = await self.link.get(Kind.ALIAS, alias_id(namespace, head), rec.AliasRecord,
                                     ALIAS_LOOKUP_S)
        if record is None:
            return False
        known = {s.name: s for s in self.view.prefixes.specs()}
        for e in record.entries:
            spec = known.get(e.name)
            # a prefix since removed gives no aliases; one registered as token ids gives only
            # its own tokens (a record cannot make other pages shareable)
            if spec is None or e.page_size <= 0 or (
                    spec.token_ids is not None
                    and tuple(e.tokens) != spec.token_ids[:len(e.tokens)]):
                continue
            aliases.adopt(namespace, head, AliasEntry(e.name, e.salt, tuple(e.tokens),
                                                      e.page_size))
        return bool(aliases.entries(namespace, head))
