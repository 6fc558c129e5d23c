"""The cluster's network as a graph: hosts, NICs, switches and the links between them.

Holders (workers, pools) are placed on nodes. The bandwidth between two holders is the smallest
link bandwidth on the fewest-hops path between their nodes (the bottleneck); two holders on one
node use ``local_bandwidth_Bps`` (a host memory copy). Measured transfers correct the bottleneck
link by an exponentially weighted moving average, so a congested sender shows up as slow.
Pure (networkx only): no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import pairwise

import networkx as nx

from radix_global.types import HolderId

GBPS = 1e9 / 8  # bytes per second in one gigabit per second


class TopologyError(ValueError):
    """Unknown holder or node, or no path between two holders."""


class Topology:
    def __init__(self, local_bandwidth_Bps: float = 20e9, ewma_alpha: float = 0.2) -> None:
        if local_bandwidth_Bps <= 0 or not 0 < ewma_alpha <= 1:
            raise ValueError("local bandwidth must be > 0 and 0 < ewma_alpha <= 1")
        self._graph: nx.Graph = nx.Graph()
        self._placement: dict[HolderId, Hashable] = {}
        self._paths: dict[tuple[Hashable, Hashable], list[Hashable]] = {}
        self.local_bandwidth_Bps = local_bandwidth_Bps
        self.ewma_alpha = ewma_alpha

    def add_link(self, a: Hashable, b: Hashable, bandwidth_Bps: float) -> None:
        """A (full-duplex) link; adding it again replaces its bandwidth."""
        if bandwidth_Bps <= 0:
            raise ValueError(f"link {a}-{b}: bandwidth must be > 0")
        self._graph.add_edge(a, b, bandwidth=float(bandwidth_Bps))
        self._paths.clear()

    def place(self, holder: HolderId, node: Hashable) -> None:
        """Put a worker or pool on a node (its host); the node is created if new."""
        self._graph.add_node(node)
        self._placement[holder] = node

    def remove(self, holder: HolderId) -> None:
        self._placement.pop(holder, None)

    def knows(self, holder: HolderId) -> bool:
        return holder in self._placement

    def path(self, src: HolderId, dst: HolderId) -> list[Hashable]:
        a, b = self._node(src), self._node(dst)
        key = (a, b)
        cached = self._paths.get(key)
        if cached is None:
            try:
                cached = nx.shortest_path(self._graph, a, b)
            except nx.NetworkXNoPath as exc:
                raise TopologyError(f"no path between {src!r} and {dst!r}") from exc
            self._paths[key] = cached
        return cached

    def bandwidth_Bps(self, src: HolderId, dst: HolderId) -> float:
        """Bottleneck bandwidth from ``src`` to ``dst`` in bytes per second."""
        nodes = self.path(src, dst)
        if len(nodes) == 1:
            return self.local_bandwidth_Bps
        return min(self._graph.edges[u, v]["bandwidth"] for u, v in pairwise(nodes))

    def observe_transfer(self, src: HolderId, dst: HolderId, nbytes: int, seconds: float) -> None:
        """A measured transfer: move the bottleneck link's (or the local) bandwidth towards the
        observed rate. Nonsensical measurements are ignored."""
        if nbytes <= 0 or seconds <= 0:
            return
        observed = nbytes / seconds
        nodes = self.path(src, dst)
        a = self.ewma_alpha
        if len(nodes) == 1:
            self.local_bandwidth_Bps = (1 - a) * self.local_bandwidth_Bps + a * observed
            return
        edges = list(pairwise(nodes))
        u, v = min(edges, key=lambda e: self._graph.edges[e]["bandwidth"])
        old = self._graph.edges[u, v]["bandwidth"]
        self._graph.edges[u, v]["bandwidth"] = (1 - a) * old + a * observed

    def _node(self, holder: HolderId) -> Hashable:
        node = self._placement.get(holder)
        if node is None:
            raise TopologyError(f"holder {holder!r} is not placed in the topology")
        return node


def star_cluster(hosts: dict[str, list[HolderId]], nic_Bps: float) -> Topology:
    """A common shape: every host hangs off one switch by a NIC of ``nic_Bps``.
    ``hosts`` maps host name -> the holders (workers, pools) on it."""
    topo = Topology()
    switch = ("switch", "tor")
    for host, holders in hosts.items():
        topo.add_link(host, switch, nic_Bps)
        for holder in holders:
            topo.place(holder, host)
    return topo
