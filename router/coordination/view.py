"""One router's view beyond its own work: the load view (its own work, the other routers', the
engines' reports; ``docs/interfaces.md``, "Several routers, one view", "The load view"), and,
with a coordination service, the link that shares membership and state with its peers.

Without ``coordination_url`` there is no link: peers' load is zero, every job runs here
(:meth:`leads`), and the view is ready at once, as a router alone always was.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Hashable
from typing import Any

import httpx

from radix_global.types import PageKey, WorkerId
from router.cluster.engine_loads import EngineLoad, EngineLoadConfig, EngineLoadPoller
from router.cluster.registry import WorkerEntry, WorkerRegistry
from router.coordination.bridge import LinkSink, ProfileSink, SharedView, SharedWrites
from router.coordination.config import CoordinationConfig
from router.coordination.link import Coordinator
from router.keying.alias_book import AliasBook
from router.keying.shared_prefixes import SharedPrefixes
from router.routing.dispatch_gate import fair_share
from router.routing.driver import PolicyDriver
from router.routing.load_view import NO_LOAD, SlotLoad, own_loads
from router.routing.queue_model import Slot

# The remainder of a server's depth split among routers (more routers than places) moves from
# one to the next this often: wall-clock seconds, which the routers agree on to a few ms.
SHARE_TURN_S = 1.0


class LoadView:
    """The slots' load beyond this router (:class:`router.cluster.slots.SlotView`), and the
    coordination link when there is one (``link``, ``writes``: None when alone)."""

    def __init__(self, coordination: CoordinationConfig, engines: EngineLoadConfig, *,
                 registry: WorkerRegistry, driver: PolicyDriver, client: httpx.AsyncClient,
                 prefixes: SharedPrefixes, aliases: AliasBook, profile: ProfileSink,
                 links: LinkSink,
                 heartbeat_ttl_s: float, router_id: str, version: str, digest: str,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.registry, self.driver, self.clock, self.wall = registry, driver, clock, wall
        self.engines = EngineLoadPoller(client, engines, self._targets, clock)
        self.link: Coordinator | None = None
        self.writes: SharedWrites | None = None
        self.shared: SharedView | None = None
        if coordination.url is not None:
            self.shared = SharedView(registry, prefixes, aliases.forget, profile, clock,
                                     heartbeat_ttl_s, links)
            self.link = Coordinator(coordination, router_id, version, digest, self.shared,
                                    self.own, clock, own_links=links.own_links)
            self.writes = SharedWrites(self.link, self.shared)
            driver.on_change = self.link.changed
            driver.on_routed = self.link.routed
            self.link.reader.on_peer_routed = self._peer_routed
            if driver.gate is not None:
                driver.gate.elsewhere = self.prefilling_elsewhere
                driver.gate.share = self.share_of
                self.link.reader.on_peer_load = driver.peers_changed

    def _peer_routed(self, slot: Slot, tip: PageKey) -> None:
        """A peer routed a prompt ending in ``tip`` to ``slot``; a slot no registered worker
        has is ignored (a hostile or stale record must not grow the memory)."""
        entry = self.registry.find(slot[0])
        if entry is not None and 0 <= slot[1] < entry.info.dp_size:
            self.driver.policy.on_peer_routed(slot, tip, self.clock())

    def _targets(self) -> list[tuple[str, str, str, int]]:
        return [(e.info.worker_id, e.info.url, e.info.engine, e.info.dp_size)
                for e in self.registry.all()]

    # --- the slot view (router/cluster/slots.py) -------------------------------------------

    def peer(self, slot: Slot) -> SlotLoad:
        return self.link.peers.load(slot, self.clock()) if self.link is not None else NO_LOAD

    def engine(self, slot: Slot) -> EngineLoad | None:
        return self.engines.load(slot)

    def loaded(self) -> list[Slot]:
        peers = self.link.peers.slots() if self.link is not None else []
        now = self.clock()
        return [*peers, *(s for s in self.engines.slots() if self.engines.load(s, now) is not None)]

    def prefilling_elsewhere(self, server: Hashable) -> int:
        """Other routers' prefills without a first token on a FIFO server (a slot, or a
        compute domain: all its slots), which the dispatch gate counts as taken room."""
        if self.link is None:
            return 0
        queue, now = self.driver.cost.queue, self.clock()
        lead = queue.lead_slot(server)
        if lead is not None and lead == server:  # a slot is its own lead: no domain to sum
            return self.link.peers.load(lead, now).prefilling
        return sum(self.link.peers.load(s, now).prefilling for s in self.link.peers.slots()
                   if queue.server(s) == server)

    def share_of(self, server: Hashable, waiting_here: bool) -> int:
        """How much of ``server``'s dispatch depth this router may book while peers hold
        requests for it too (:func:`router.routing.dispatch_gate.fair_share`); none when this
        router holds none for it (``waiting_here``) and peers do: they split all of it."""
        gate = self.driver.gate
        assert gate is not None  # asked by the gate only
        lead = self.driver.cost.queue.lead_slot(server)
        if self.link is None or lead is None:
            return gate.depth
        waiting = self.link.peers.waiting(lead)
        if not waiting:
            return gate.depth
        if not waiting_here:
            return 0
        key = zlib.crc32(f"{lead[0]}:{lead[1]}".encode())
        return fair_share(gate.depth, self.link.router_id, waiting, key,
                          int(self.wall() / SHARE_TURN_S))

    def own(self) -> dict[Slot, SlotLoad]:
        """This router's in-flight work per slot (what it publishes). The dispatch gate's held
        and released requests wait for a server: each is published on the server's lead slot
        (``QueueModel.lead_slot``), where every router looks for them."""
        queue = self.driver.cost.queue
        active, prefills = queue.slot_work()
        gate = self.driver.gate
        if gate is None:
            return own_loads(active, prefills, self.driver.decode.reserved(), ())

        def on_leads(servers: list[Hashable]) -> list[Slot]:
            return [lead for s in servers if s is not None
                    and (lead := queue.lead_slot(s)) is not None]

        return own_loads(active, prefills, self.driver.decode.reserved(),
                         on_leads(gate.held_servers()), on_leads(gate.released_servers()))

    # --- life cycle and jobs -----------------------------------------------------------------

    def leads(self) -> bool:
        """Whether this router runs the once-per-cluster jobs (alone: always)."""
        return self.link is None or self.link.leads()

    def fitted_elsewhere(self, worker_id: str, namespace: str) -> tuple[float, ...] | None:
        """A prefill profile the leader fitted, read from the service."""
        if self.shared is None:
            return None
        return self.shared.profiles.get((worker_id, namespace))

    def fitted_here(self, worker_id: str, namespace: str, coef: tuple[float, ...]) -> None:
        if self.writes is not None:
            self.writes.profile_fitted(worker_id, namespace, coef)

    @property
    def ready(self) -> bool:
        """Membership and shared state read (alone: at once)."""
        return self.link is None or self.link.synced

    def admitted(self, entry: WorkerEntry) -> None:
        if self.writes is not None:
            self.writes.worker_admitted(entry)

    def worker_removed(self, worker_id: WorkerId) -> None:
        """Its slots stop counting in the peers' load until a peer publishes them again."""
        if self.link is not None:
            self.link.peers.forget_worker(worker_id)

    @property
    def degraded(self) -> bool:
        """The service is not answering: this router routes on its last view."""
        return self.link is not None and self.link.degraded

    def stats(self) -> dict[str, Any] | None:
        return self.link.stats() if self.link is not None else None

    async def start(self) -> None:
        self.engines.start()
        if self.link is not None:
            await self.link.start()

    async def stop(self) -> None:
        if self.link is not None:
            await self.link.stop()
        await self.engines.stop()

