"""Hosts whose Mooncake segment died with its worker, told to the pool backends so they do not
read the replicas the store still lists there (``docs/interfaces.md``, "Mooncake Store as the
L3 pool": reads around a lost host). Pure: the clock is passed in.

A host is lost when a worker whose pool is a segment there leaves the router (no heartbeat,
failed health checks or connects, or deregistered: a segment that closed cleanly has no
replicas left to skip) and no other registered worker has a segment on it; for ``hold_s``, or
until a worker with a segment there registers (a changed registration leaves and joins at
once).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from radix_global.pool_ids import segment_host
from radix_global.registration import WorkerInfo

HOLD_S = 60.0  # longer than the store lists a dead client's replicas in our measurements


class LostHosts:
    def __init__(self, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic):
        self.hold_s, self.clock = hold_s, clock
        self._until: dict[str, float] = {}

    def left(self, info: WorkerInfo, others: Iterable[WorkerInfo]) -> None:
        """``info``'s worker left; ``others``: the workers still registered."""
        host = segment_host(info.pool_id) if info.pool_id else None
        if host is None or any(segment_host(o.pool_id) == host for o in others if o.pool_id):
            return
        self._until[host] = self.clock() + self.hold_s

    def joined(self, info: WorkerInfo) -> None:
        host = segment_host(info.pool_id) if info.pool_id else None
        if host is not None:
            self._until.pop(host, None)

    def hosts(self) -> list[str]:
        now = self.clock()
        self._until = {h: t for h, t in self._until.items() if t > now}
        return sorted(self._until)
