"""Hosts a Mooncake reader takes as lost, for a while (``docs/interfaces.md``, "Mooncake Store
as the L3 pool": reads around a lost host). Pure: the clock is passed in.

A host whose client died keeps its replicas listed by the master for minutes, and each read of
one stalls the reader for the connect to an unreachable host. A reader that failed on a key
takes the hosts of that key's replicas (its own excepted) as lost for ``hold_s``, and the
routers tell it the hosts of the segments that died with their worker (:meth:`told`); a key
whose replicas all sit on lost hosts is not read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

log = logging.getLogger(__name__)
HOLD_S = 60.0
SEEN_S = 10.0  # a host read from within this long is not probed again


def host_of(endpoint: str) -> str:
    """``10.0.0.2:16410`` -> ``10.0.0.2`` (``[::1]:1`` -> ``[::1]``)."""
    return endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint


class LostHosts:
    def __init__(self, own_endpoint: str, hold_s: float = HOLD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.own = host_of(own_endpoint)
        self.hold_s, self.clock = hold_s, clock
        self._until: dict[str, float] = {}
        self._told: set[str] = set()  # the routers' list, as of their last answer
        self._seen: dict[str, float] = {}  # host -> when a read from it last worked

    def known(self) -> bool:
        """Whether any host is taken as lost now (the readers check keys only then)."""
        now = self.clock()
        self._until = {h: t for h, t in self._until.items() if t > now}
        return bool(self._until or self._told)

    def hosts(self) -> list[str]:
        return sorted(set(self._until) | self._told) if self.known() else []

    def told(self, hosts: Iterable[str]) -> None:
        """The routers' hosts whose segment died with its worker (``GET /admin/pool-copies``),
        replacing what they said before. Safe from another thread without the pool's lock (a
        new set is assigned), so a read that stalls does not hold the word back."""
        told = set(hosts) - {self.own}
        for host in told - self._told:
            log.warning("the router says host %s is lost: its replicas are skipped", host)
        self._told = told

    def failed(self, endpoints: Iterable[str]) -> None:
        """A read of a key whose replicas sit at ``endpoints`` failed. Its host is lost when
        the key has one replica elsewhere; with several the read cannot say which one failed:
        none is blamed (a host already lost explains it, or the routers will say)."""
        hosts = {host_of(e) for e in endpoints} - {self.own}
        if len(hosts) != 1 or hosts & (set(self._until) | self._told):
            return
        (host,) = hosts
        if host not in self._until:
            log.warning("Mooncake reads from host %s fail: its replicas are skipped for %.0f s",
                        host, self.hold_s)
        self._until[host] = self.clock() + self.hold_s

    def seen(self, endpoints: Iterable[str]) -> None:
        """A read of a key whose replicas sit at ``endpoints`` worked: its host answers (with
        several replicas the read cannot say which one answered: none is taken)."""
        hosts = {host_of(e) for e in endpoints}
        if len(hosts) == 1:
            self._seen[hosts.pop()] = self.clock()

    def plan(self, keys: Sequence[str], where: Mapping[str, Sequence[str]]
             ) -> tuple[int, list[int]]:
        """How to read ``keys`` (``where``: each key's replica endpoints; a key not in it is
        left to the read): ``(cut, probes)``, read ``keys[:cut]`` only (``keys[cut]`` is the
        first whose replicas all sit on lost hosts), and first, each alone, the ``probes``: the
        first key held on that host alone of each host no read worked from within ``SEEN_S``
        (ours excepted), so a host that died unnoticed costs one stalled read, not one per key
        of the batch (its keys that also have a replica elsewhere are not probed: Mooncake
        picks the replica it reads)."""
        self.known()
        cut = next((i for i, k in enumerate(keys) if self.unreadable(where.get(k, ()))),
                   len(keys))
        now, probed, probes = self.clock(), {self.own, *self._until, *self._told}, []
        for i, key in enumerate(keys[:cut]):
            hosts = {host_of(e) for e in where.get(key, ())}
            if len(hosts) != 1 or hosts <= probed:  # a probe must say which host answered
                continue
            (host,) = hosts
            if now - self._seen.get(host, -SEEN_S) >= SEEN_S:
                probes.append(i)
            probed.add(host)
        return cut, probes

    def unreadable(self, endpoints: Iterable[str]) -> bool:
        """Whether a key (its replicas at ``endpoints``) is not to be read: a replica sits on a
        lost host and none on ours. Mooncake picks the replica it reads (ours when it has one,
        as measured), so a key with a live replica elsewhere beside a dead one can still stall
        the read, key after key (measured: 3 s each). A key with no replica listed is left to
        the read (it is a miss anyway)."""
        hosts = {host_of(e) for e in endpoints}
        return self.own not in hosts and bool(hosts & (set(self._until) | self._told))
