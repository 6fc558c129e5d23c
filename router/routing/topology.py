"""The cluster's network as a graph: hosts, fault domains (racks, zones) and the links between them.

Holders (workers, pools) are placed on nodes. The bandwidth between two holders is the smallest
link bandwidth on the fewest-hops path between their nodes (the bottleneck); two holders on one
node use that node's local bandwidth (a host memory copy, ``local_bandwidth_Bps`` until measured).
A measured transfer is a sample of the bottleneck link (or of the node's memory path): once a
link has enough of them, its bandwidth and per-transfer overhead are what they say
(:class:`router.routing.link_fit.LinkFit`), so a congested link shows up as slow. Other
routers' sums for a link (:meth:`Topology.share`) add to this router's own: the link is fitted
on every router's samples (docs/interfaces.md, "Where hosts are": several routers).
Pure (networkx only): no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from itertools import pairwise
from typing import Any

import networkx as nx

from radix_global.types import HolderId
from router.routing.link_fit import LinkEstimate, LinkFit, LinkStats, estimate_of, summed

GBPS = 1e9 / 8  # bytes per second in one gigabit per second
LinkKey = tuple[str, str]  # a link's two node names, sorted; (n, n): node n's memory path


def link_key(a: Hashable, b: Hashable) -> LinkKey:
    u, v = str(a), str(b)
    return (u, v) if u <= v else (v, u)


class TopologyError(ValueError):
    """Unknown holder or node, or no path between two holders."""


class Topology:
    def __init__(self, local_bandwidth_Bps: float = 20e9,
                 fit: Callable[[], LinkFit] = LinkFit) -> None:
        if local_bandwidth_Bps <= 0:
            raise ValueError("local bandwidth must be > 0")
        self._graph: nx.Graph = nx.Graph()
        self._placement: dict[HolderId, Hashable] = {}
        self._paths: dict[tuple[Hashable, Hashable], list[Hashable]] = {}
        self._bottlenecks: dict[tuple[Hashable, Hashable], tuple[float, float]] = {}
        self._local: dict[Hashable, LinkFit] = {}  # node -> its memory path's measurements
        self.local_bandwidth_Bps = local_bandwidth_Bps
        self._fit = fit
        self._peers: dict[str, dict[LinkKey, LinkStats]] = {}  # router -> its sums per link
        self._min_samples = fit().min_samples

    def add_link(self, a: Hashable, b: Hashable, bandwidth_Bps: float) -> None:
        """A (full-duplex) link; adding it again with another figure sets its bandwidth anew
        (what this router measured on it is forgotten; its peers' sums still count)."""
        if not bandwidth_Bps > 0:
            raise ValueError(f"link {a}-{b}: bandwidth must be > 0")
        if self._graph.has_edge(a, b) and self._graph.edges[a, b]["configured"] == bandwidth_Bps:
            return
        self._graph.add_edge(a, b, bandwidth=float(bandwidth_Bps), configured=float(bandwidth_Bps),
                             overhead=0.0, fit=self._fit())
        self._refit(a, b)
        self._changed()

    def cut(self, a: Hashable, b: Hashable) -> None:
        """Remove the link between ``a`` and ``b`` (absent: nothing)."""
        if self._graph.has_edge(a, b):
            self._graph.remove_edge(a, b)
            self._changed()

    def neighbours(self, node: Hashable) -> list[Hashable]:
        return list(self._graph.neighbors(node)) if node in self._graph else []

    def drop_node(self, node: Hashable) -> None:
        """Remove ``node`` and its links (a host whose last holder left)."""
        if node in self._graph:
            self._graph.remove_node(node)
            self._local.pop(node, None)
            self._changed()

    def _changed(self) -> None:
        self._paths.clear()
        self._bottlenecks.clear()

    def place(self, holder: HolderId, node: Hashable) -> None:
        """Put a worker or pool on a node (its host); the node is created if new."""
        self._graph.add_node(node)
        self._placement[holder] = node

    def remove(self, holder: HolderId) -> None:
        self._placement.pop(holder, None)

    def knows(self, holder: HolderId) -> bool:
        return holder in self._placement

    def node_of(self, holder: HolderId) -> Hashable | None:
        return self._placement.get(holder)

    def holders_on(self, node: Hashable) -> list[HolderId]:
        return [h for h, n in self._placement.items() if n == node]

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
        return self.link(src, dst)[0]

    def overhead_s(self, src: HolderId, dst: HolderId) -> float:
        """What one transfer from ``src`` to ``dst`` costs besides its bytes, as measured on
        its bottleneck (0 until measured)."""
        return self.link(src, dst)[1]

    def observe_transfer(self, src: HolderId, dst: HolderId, nbytes: int, seconds: float) -> None:
        """A measured transfer, a sample of the bottleneck link (or of the node's memory path).
        Nonsensical measurements are ignored."""
        if nbytes <= 0 or seconds <= 0:
            return
        nodes = self.path(src, dst)
        if len(nodes) == 1:
            fit = self._local.get(nodes[0])
            if fit is None:
                fit = self._local[nodes[0]] = self._fit()
            fit.observe(nbytes, seconds)
            self._bottlenecks.clear()
            return
        u, v = self._slowest(nodes)
        self._graph.edges[u, v]["fit"].observe(nbytes, seconds)
        self._refit(u, v)

    def own_links(self) -> dict[LinkKey, LinkStats]:
        """This router's measured links and memory paths, as sums (what it shares)."""
        out = {link_key(n, n): fit.stats() for n, fit in self._local.items() if fit.samples}
        out.update({link_key(u, v): d["fit"].stats()
                    for u, v, d in self._graph.edges(data=True) if d["fit"].samples})
        return out

    def share(self, router: str, links: dict[LinkKey, LinkStats]) -> None:
        """``router``'s latest sums, in place of its earlier ones; a link this topology lacks
        is kept for when it appears."""
        old = self._peers.get(router, {})
        if links:
            self._peers[router] = links
        else:
            self._peers.pop(router, None)
        changed = {k for k in old.keys() | links.keys() if old.get(k) != links.get(k)}
        for u, v in list(self._graph.edges):
            if link_key(u, v) in changed:
                self._refit(u, v)
        self._bottlenecks.clear()  # memory paths are fitted when asked for

    def unshare(self, router: str) -> None:
        """``router``'s sums no longer count (it stopped, or its record is gone)."""
        self.share(router, {})

    def peers(self) -> list[str]:
        return sorted(self._peers)

    def _peer_samples(self, key: LinkKey) -> int:
        return sum(links[key].samples for links in self._peers.values() if key in links)

    def _stats(self, key: LinkKey, fit: LinkFit | None) -> LinkStats:
        """This router's sums of the link (``fit``; None: not measured here) and its peers'."""
        own = [fit.stats()] if fit is not None else []
        return summed([*own, *(links[key] for links in self._peers.values() if key in links)])

    def _refit(self, u: Hashable, v: Hashable) -> None:
        """Price the link ``u``-``v`` on every router's sums (as configured until they weigh
        in)."""
        self._bottlenecks.clear()
        edge = self._graph.edges[u, v]
        measured = estimate_of(self._stats(link_key(u, v), edge["fit"]), edge["fit"].min_samples)
        edge["bandwidth"], edge["overhead"] = (
            measured if measured is not None else (edge["configured"], 0.0))

    def report(self) -> dict[str, Any]:
        """Links (bandwidth now and as configured, measured overhead), the memory paths measured
        enough to be estimated, placements."""
        shared = {n for n in self._graph.nodes if self._peer_samples(link_key(n, n))}
        local = {n: self._local_estimate(n) for n in self._local.keys() | shared}
        return {
            "links": [{"a": str(u), "b": str(v), "bandwidth_Bps": d["bandwidth"],
                       "configured_Bps": d["configured"], "overhead_s": d["overhead"],
                       "samples": d["fit"].samples,
                       "peer_samples": self._peer_samples(link_key(u, v))}
                      for u, v, d in self._graph.edges(data=True)],
            "local": {str(n): {"bandwidth_Bps": e.bandwidth_Bps, "overhead_s": e.overhead_s,
                               "samples": self._local[n].samples if n in self._local else 0,
                               "peer_samples": self._peer_samples(link_key(n, n))}
                      for n, e in local.items() if e is not None},
            "local_default_Bps": self.local_bandwidth_Bps,
            "placed": {h: str(n) for h, n in self._placement.items()},
            "peers": self.peers(),
        }

    def link(self, src: HolderId, dst: HolderId) -> tuple[float, float]:
        """(bandwidth, per-transfer overhead) of the bottleneck from ``src`` to ``dst``."""
        # asked for every fetch the conductor prices, so kept until a link or a measurement
        # changes
        key = (self._node(src), self._node(dst))
        cached = self._bottlenecks.get(key)
        if cached is not None:
            return cached
        nodes = self.path(src, dst)
        found: tuple[float, float] = (self.local_bandwidth_Bps, 0.0)
        if len(nodes) == 1:
            measured = self._local_estimate(nodes[0])
            if measured is not None:
                found = (measured.bandwidth_Bps, measured.overhead_s)
        else:
            edge = self._graph.edges[self._slowest(nodes)]
            found = (edge["bandwidth"], edge["overhead"])
        self._bottlenecks[key] = found
        return found

    def _local_estimate(self, node: Hashable) -> LinkEstimate | None:
        stats = self._stats(link_key(node, node), self._local.get(node))
        return estimate_of(stats, self._min_samples)

    def _slowest(self, nodes: list[Hashable]) -> tuple[Hashable, Hashable]:
        """The path's bottleneck link; among equal ones the nearest the path's middle: links
        configured alike (a NIC and an uplink at one figure) put the samples of a transfer
        between racks on an uplink, not on the sender's own NIC, which its transfers within
        the rack cross too."""
        edges = list(pairwise(nodes))
        middle = (len(edges) - 1) / 2
        return min(enumerate(edges), key=lambda ie: (self._graph.edges[ie[1]]["bandwidth"],
                                                      abs(ie[0] - middle)))[1]

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
