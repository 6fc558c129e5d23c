"""What a router does with a record read from the coordination service: refuse it (counted,
logged once per key), or hand it to the router's :class:`SharedState`. No I/O of its own
(``on_peer_load`` may release requests the dispatch gate holds).

A complete read of one kind (every id its index set lists) also says what is gone:
:meth:`Reader.present` hands the ids to the router, which drops what it took from the service
and no longer finds there (a deletion whose notice was lost, a worker whose record expired).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

import msgspec

from radix_global.types import PageKey
from router.coordination import records as rec
from router.coordination.records import Kind, RecordError
from router.routing.link_fit import LinkStats
from router.routing.load_view import PeerLoads
from router.routing.queue_model import Slot
from router.routing.topology import LinkKey

log = logging.getLogger("radix_global.router.coordination")
R = TypeVar("R", bound=msgspec.Struct)
MAX_LOGGED_KEYS = 4096


class SharedState(Protocol):
    """What the link hands to the router. Each call is one record read from the service; a
    call may raise :class:`RecordError` when the record contradicts the router's state."""

    def worker_seen(self, record: rec.WorkerRecord, ident: str) -> None: ...
    def worker_gone(self, worker_id: str) -> None: ...
    def drained(self, worker_id: str) -> None: ...
    def undrained(self, worker_id: str) -> None: ...
    def prefix_seen(self, record: rec.PrefixRecord) -> None: ...
    def prefix_gone(self, name: str) -> None: ...
    def profile_seen(self, record: rec.ProfileRecord) -> None: ...
    def links_seen(self, router_id: str, links: dict[LinkKey, LinkStats]) -> None: ...
    def links_gone(self, router_id: str) -> None: ...

    def present(self, kind: Kind, ids: set[str]) -> None:
        """A complete read found exactly ``ids`` of ``kind``: what the router took from the
        service and is not among them is gone."""

    def owned(self) -> list[tuple[Kind, str, bytes, float | None]]:
        """Records this router owns, rewritten after an outage: (kind, id, value, ttl_s)."""
        ...


class Reader:
    def __init__(self, router_id: str, shared: SharedState, peers: PeerLoads,
                 clock: Callable[[], float]) -> None:
        self.router_id, self.shared, self.peers, self.clock = router_id, shared, peers, clock
        self.refused: collections.Counter[str] = collections.Counter()  # per record kind
        self._logged: set[str] = set()
        # called after the peers' load changed (a newer publication, one gone)
        self.on_peer_load: Callable[[], None] | None = None
        # called with each prompt a peer routed (its slot, its last page key), from a newer
        # publication only
        self.on_peer_routed: Callable[[Slot, PageKey], None] | None = None

    def apply(self, kind: Kind, ident: str, raw: bytes | str) -> None:
        """One record as read; refused (counted) when it does not decode or does not fit."""
        try:
            self._apply(kind, ident, raw)
        except Exception as exc:  # any record the router cannot take: never a crash, never
            self.refuse(kind, ident, exc)  # half-applied state of a background loop
            if kind is Kind.LINK and ident != self.router_id:
                self.shared.links_gone(ident)  # its last good sums must not count for ever

    def gone(self, kind: Kind, ident: str) -> None:
        """A notice for a key that is absent now: deleted."""
        if kind is Kind.WORKER:
            self.shared.worker_gone(ident)
        elif kind is Kind.DRAIN:
            self.shared.undrained(ident)
        elif kind is Kind.PREFIX:
            self.shared.prefix_gone(ident)
        elif kind is Kind.LOAD:
            self.peers.drop(ident)
            self._peer_load()
        elif kind is Kind.LINK:
            self.shared.links_gone(ident)

    def present(self, kind: Kind, ids: set[str]) -> None:
        if kind is Kind.LOAD:
            before = self.peers.routers()
            for rid in before:
                if rid not in ids:
                    self.peers.drop(rid)
            self.peers.expire(self.clock())
            if self.peers.routers() != before:
                self._peer_load()
        else:
            self.shared.present(kind, ids)

    def decode(self, kind: Kind, ident: str, raw: bytes | str, record: type[R],
               check_id: bool = True) -> R | None:
        try:
            return rec.decode(raw, record, ident if check_id else None)
        except RecordError as exc:
            self.refuse(kind, ident, exc)
            return None

    def refuse(self, kind: Kind | str, ident: str, exc: Exception) -> None:
        self.refused[str(kind)] += 1
        key = f"{kind}:{ident[:120]}"
        if key not in self._logged and len(self._logged) < MAX_LOGGED_KEYS:
            self._logged.add(key)
            log.error("coordination: refused record %s: %s", key, exc)

    def _apply(self, kind: Kind, ident: str, raw: bytes | str) -> None:
        if kind is Kind.WORKER:
            worker = rec.decode(raw, rec.WorkerRecord, ident)
            rec.worker_info(worker, ident)  # checked as a registration is, before anything
            self.shared.worker_seen(worker, ident)
        elif kind is Kind.DRAIN:
            rec.decode(raw, rec.DrainRecord, ident)
            self.shared.drained(ident)
        elif kind is Kind.PREFIX:
            self.shared.prefix_seen(rec.decode(raw, rec.PrefixRecord, ident))
        elif kind is Kind.PROFILE:
            self.shared.profile_seen(rec.decode(raw, rec.ProfileRecord))
        elif kind is Kind.LINK and ident != self.router_id:
            self.shared.links_seen(ident, rec.link_stats(rec.decode(raw, rec.LinkRecord, ident)))
        elif kind is Kind.LOAD and ident != self.router_id:
            load = rec.decode(raw, rec.LoadRecord, ident)
            slots, tips = rec.load_slots(load), rec.load_tips(load)  # all checked first
            counted = ident in self.peers.counted()
            gave = self.peers.update(ident, load.seq, slots, self.clock())
            if gave is None:
                self.peers.refreshed(ident, self.clock())
                return
            # a peer's first record read may be old (a quiet router only refreshes its TTL):
            # its tips are not news
            if counted and self.on_peer_routed is not None:
                for slot, tip in tips:
                    self.on_peer_routed(slot, tip)
            if gave:  # room another router freed, or no longer shares
                self._peer_load()

    def _peer_load(self) -> None:
        if self.on_peer_load is not None:
            self.on_peer_load()
