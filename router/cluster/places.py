"""The router's topology, built from where its workers say they are (``docs/interfaces.md``,
"Where hosts are").

A worker's ``place`` (``zone-a/rack-3``) and its URL's address put its host in a tree: the
host hangs off its innermost fault domain by its NIC, each domain off its parent by an uplink,
the widest ones off the root. The worker and the pool it writes are placed on hosts (a Mooncake
segment on the segment's own address), so the cost model prices a fetch on the path between
the holder's host and the candidate's. A disk tier holder is not placed: it keeps the read
bandwidth its worker measured.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlsplit

from radix_global.options import opt
from radix_global.pool_ids import segment_host
from radix_global.registration import WorkerInfo, check_place
from radix_global.types import HolderId, PoolId, WorkerId
from router.routing.link_fit import LinkStats
from router.routing.topology import LinkKey, Topology

log = logging.getLogger(__name__)
ROOT = "domain:"


@dataclass(frozen=True)
class TopologyConfig:
    """The cluster's links (router/cluster/places.py): what is not measured is configured here."""

    uplink_Bps: Annotated[float, opt(
        "a fault domain's link to the one above it (rack -> zone -> the cluster's core), "
        "bytes/s", gt=0, name="topology_uplink_bytes_per_s")] = 1.25e9
    links: Annotated[dict[str, float], opt(
        "one domain's uplink as DOMAIN=BYTES_PER_S, the domain by its whole place "
        "(zone-a/rack-3=6.25e6)", metavar="DOMAIN=BYTES_PER_S")] = field(default_factory=dict)
    learn: Annotated[bool, opt(
        "the pool loads workers report refine the links' bandwidths")] = True

    def __post_init__(self) -> None:
        for domain, bandwidth in self.links.items():
            check_place(domain)
            if not bandwidth > 0:
                raise ValueError(f"topology_links {domain}: bandwidth must be > 0")


def host_node(address: str) -> str:
    return f"host:{address}"


def domain_node(labels: list[str]) -> str:
    return "domain:" + "/".join(labels)


class Places:
    """Keeps a :class:`Topology` in step with the registered workers."""

    def __init__(self, config: TopologyConfig, host_link_Bps: float,
                 local_bandwidth_Bps: float) -> None:
        self.config = config
        self.host_link_Bps = host_link_Bps
        self.topology = Topology(local_bandwidth_Bps=local_bandwidth_Bps)
        self._holders: dict[WorkerId, list[HolderId]] = {}  # worker -> what it placed
        self._places: dict[str, str] = {}  # host node -> its place ("" : the root)

    def joined(self, info: WorkerInfo) -> None:
        """Place ``info``'s worker (and its pool) on its host, in its place; called again for a
        changed record, what it no longer names leaves."""
        worker = WorkerId(info.worker_id)
        labels = check_place(info.place) if info.place else []
        address = urlsplit(info.url).hostname or info.url
        node = host_node(address)
        self._hang(node, labels)
        placed: list[HolderId] = [WorkerId(info.worker_id)]
        self.topology.place(placed[0], node)
        if info.pool_id:
            segment = segment_host(info.pool_id)
            pool_node = host_node(segment) if segment is not None else node
            if pool_node != node:
                self._hang(pool_node, labels)
            placed.append(PoolId(info.pool_id))
            self.topology.place(placed[1], pool_node)
        old = self._holders.get(worker, [])
        self._holders[worker] = placed
        for holder in old:
            if holder not in placed:
                self._release(holder)

    def left(self, worker: WorkerId) -> None:
        """``worker`` is gone: its holders leave, and a host with none left leaves too."""
        for holder in self._holders.pop(worker, []):
            self._release(holder)

    def observe(self, holder: PoolId, worker: WorkerId, nbytes: int, seconds: float) -> bool:
        """A measured load of ``nbytes`` in ``seconds`` from ``holder`` to ``worker``'s host;
        False when either is not placed or learning is off."""
        topo = self.topology
        if not self.config.learn or not (topo.knows(holder) and topo.knows(worker)):
            return False
        topo.observe_transfer(holder, worker, nbytes, seconds)
        return True

    def own_links(self) -> dict[LinkKey, LinkStats]:
        """What this router measured, for its peers (nothing while learning is off)."""
        return self.topology.own_links() if self.config.learn else {}

    def share(self, router: str, links: dict[LinkKey, LinkStats]) -> None:
        """A peer router's measured links (ignored while learning is off)."""
        if self.config.learn:
            self.topology.share(router, links)

    def unshare(self, router: str) -> None:
        self.topology.unshare(router)

    def domain_of(self, holder: HolderId) -> str | None:
        """``holder``'s fault domain: its host's whole place ("" under the root); None when
        it is not placed."""
        node = self.topology.node_of(holder)
        return None if node is None else self._places.get(str(node))

    def report(self) -> dict[str, Any]:
        return self.topology.report()

    def _release(self, holder: HolderId) -> None:
        if any(holder in held for held in self._holders.values()):
            return  # a pool another worker also placed (one machine's shm pool)
        node = self.topology.node_of(holder)
        self.topology.remove(holder)
        if node is not None and not self.topology.holders_on(node):
            self.topology.drop_node(node)
            self._places.pop(str(node), None)

    def _hang(self, node: str, labels: list[str]) -> None:
        """Link ``node`` (a host) under the domains ``labels``, and each domain under its
        parent, down to the root. A host placed elsewhere before moves (logged)."""
        topo = self.topology
        parent = domain_node(labels) if labels else ROOT
        stale = [n for n in list(topo.neighbours(node)) if n != parent]
        if stale:
            log.warning("host %s moves from %s to %s (a worker registered another place)",
                        node, stale[0], parent)
            for n in stale:
                topo.cut(node, n)
        topo.add_link(node, parent, self.host_link_Bps)
        self._places[node] = "/".join(labels)
        for depth in range(len(labels), 0, -1):
            domain = "/".join(labels[:depth])
            up = domain_node(labels[:depth - 1])  # [] : the root
            topo.add_link(domain_node(labels[:depth]), up,
                          self.config.links.get(domain, self.config.uplink_Bps))
