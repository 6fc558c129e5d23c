"""Router-side queue model: the prefill work this router sent to each slot and has not seen done.

Each slot is modelled as a FIFO server: request ``i`` starts at ``max(routed_at_i, done of i-1)``
and takes its predicted prefill time, so the predicted wait of a new request is when the last one
would finish. The "done" time of the previous request is known exactly when its first token came
back, which corrects every prediction behind it. Pure: time is the ``now`` the caller passes.

Workers that share their compute (``share_compute``: e.g. several CPU engines on one host, which
run concurrently but not faster together) are one FIFO server: a slot's wait is the work routed
to any of them, so spreading a request away from its cache holder buys no queueing time there.
A worker's domain is set when it joins, before it gets requests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import NamedTuple

from radix_global.types import WorkerId

Slot = tuple[WorkerId, int]


class PendingPrefill(NamedTuple):
    routed_at: float
    predicted_s: float  # prefill compute
    input_tokens: int
    prefix_tokens: int
    transfer_s: float = 0.0  # KV fetch before the prefill (occupies the slot too)
    fetch_tokens: int = 0  # of prefix_tokens, planned from the pool (the rest: local)
    wait_s: float = 0.0  # the FIFO wait this model predicted for it when it was routed
    outstanding: int = 0  # requests routed to its slot and not finished when it was routed


class CompletedPrefill(NamedTuple):
    """What ``prefill_done`` learned: the slot, the prediction, and the FIFO-inferred service
    time (``now - max(routed_at, previous done)``; exact for a one-at-a-time server)."""

    slot: Slot
    pending: PendingPrefill
    inferred_s: float


class QueueModel:
    def __init__(self) -> None:
        # Per FIFO server (a slot, or a shared compute domain): pending prefills, last done time.
        self._pending: dict[Hashable, OrderedDict[str, PendingPrefill]] = {}
        self._last_done: dict[Hashable, float] = {}
        self._active: dict[Slot, set[str]] = {}  # routed, not finished (prefill or decode)
        self._slot_of: dict[str, Slot] = {}
        self._domain: dict[WorkerId, str] = {}
        self._members: dict[str, set[WorkerId]] = {}  # the reverse of ``_domain``
        self._lead: dict[str, WorkerId] = {}  # each domain's first member by id

    def share_compute(self, worker_id: WorkerId, domain: str | None) -> None:
        """``worker_id``'s slots queue on ``domain``'s one FIFO server (None: each its own)."""
        old = self._domain.pop(worker_id, None)
        if old is not None:
            self._members[old].discard(worker_id)
            if self._members[old]:
                self._lead[old] = min(self._members[old])
            else:
                del self._members[old], self._lead[old]
        if domain is not None:
            self._domain[worker_id] = domain
            self._members.setdefault(domain, set()).add(worker_id)
            self._lead[domain] = min(self._members[domain])

    def lead_slot(self, server: Hashable) -> Slot | None:
        """The one slot that stands for ``server`` where a slot must (what a router publishes
        per slot of its held requests, which wait for a server): the slot itself, or rank 0 of
        the compute domain's first worker by id (every router picks the same); None when the
        domain has no worker."""
        if _is_domain(server):
            lead = self._lead.get(server[1])  # type: ignore[index]
            return (lead, 0) if lead is not None else None
        return server  # type: ignore[return-value]  # a slot is its own server

    def server(self, slot: Slot) -> Hashable:
        """The FIFO server ``slot`` queues on: itself, or its compute domain."""
        domain = self._domain.get(slot[0])
        return slot if domain is None else ("domain", domain)

    def add(self, slot: Slot, request_id: str, pending: PendingPrefill) -> None:
        """A request was routed to ``slot``. A duplicate id replaces the earlier record."""
        if request_id in self._slot_of:
            self.finished(request_id)
        self._pending.setdefault(self.server(slot), OrderedDict())[request_id] = pending
        self._active.setdefault(slot, set()).add(request_id)
        self._slot_of[request_id] = slot

    def prefill_done(self, request_id: str, now: float) -> CompletedPrefill | None:
        """First token of ``request_id`` seen at ``now``. Unknown/already done -> None."""
        slot = self._slot_of.get(request_id)
        if slot is None:
            return None
        server = self.server(slot)
        queue = self._pending.get(server)
        pending = queue.pop(request_id, None) if queue is not None else None
        if pending is None:
            return None
        start = max(pending.routed_at, self._last_done.get(server, pending.routed_at))
        self._last_done[server] = max(now, self._last_done.get(server, now))
        return CompletedPrefill(slot, pending, now - start)

    def finished(self, request_id: str) -> Slot | None:
        """The request ended (success or failure): drop it wherever it still is."""
        slot = self._slot_of.pop(request_id, None)
        if slot is None:
            return None
        queue = self._pending.get(self.server(slot))
        if queue is not None:
            queue.pop(request_id, None)
        active = self._active.get(slot)
        if active is not None:
            active.discard(request_id)
            if not active:  # kept small: busy() lists what is in it
                del self._active[slot]
        return slot

    def queue_s(self, slot: Slot, now: float) -> float:
        """Predicted wait before a request routed to ``slot`` at ``now`` would start prefill."""
        server = self.server(slot)
        queue = self._pending.get(server)
        if not queue:
            return 0.0
        t = self._last_done.get(server, float("-inf"))
        for i, pending in enumerate(queue.values()):
            t = max(t, pending.routed_at) + pending.predicted_s + pending.transfer_s
            if i == 0:
                t = max(t, now)  # the head is still running, whatever was predicted
        return max(0.0, t - now)

    def pending_prefills(self, slot: Slot) -> int:
        """Prefills queued on ``slot``'s FIFO server (its whole compute domain, if shared)."""
        return len(self._pending.get(self.server(slot), ()))

    def prefetch_reserved_tokens(self, slot: Slot, min_tokens: int) -> int:
        """What ``slot``'s engine holds for storage prefetches of the requests routed there
        whose first token has not come back: each one's prompt beyond its local prefix, when
        that is at least ``min_tokens`` (SGLang reserves it at arrival, found in the pool or
        not, and frees it at admission; ``docs/interfaces.md``, "Worker registration",
        ``pool_prefetch_budget_tokens``)."""
        total = 0
        for request_id, p in self._pending.get(self.server(slot), {}).items():
            rest = p.input_tokens - p.prefix_tokens + p.fetch_tokens
            if self._slot_of.get(request_id) == slot and rest >= max(1, min_tokens):
                total += rest
        return total

    def busy(self) -> tuple[list[Slot], list[WorkerId]]:
        """The slots with requests in flight (routed, not finished), and the workers of every
        compute domain with prefills queued (their slots all wait behind them)."""
        workers: list[WorkerId] = []
        for server, queue in self._pending.items():
            if queue and _is_domain(server):
                workers.extend(self._members.get(server[1], ()))  # type: ignore[index]
        return list(self._active), workers

    def outstanding(self, slot: Slot) -> int:
        return len(self._active.get(slot, ()))

    def slot_work(self) -> tuple[dict[Slot, int], dict[Slot, tuple[int, int]]]:
        """This router's work per slot, for the shared load view: requests routed and not
        finished, and (prefills without a first token, their prompt tokens beyond the prefix)."""
        active = {slot: len(ids) for slot, ids in self._active.items() if ids}
        prefills: dict[Slot, tuple[int, int]] = {}
        for queue in self._pending.values():
            for request_id, p in queue.items():
                slot = self._slot_of.get(request_id)
                if slot is not None:
                    n, tokens = prefills.get(slot, (0, 0))
                    prefills[slot] = (n + 1, tokens + max(0, p.input_tokens - p.prefix_tokens))
        return active, prefills

    def forget_worker(self, worker_id: WorkerId) -> None:
        for slot in [s for s in self._active if s[0] == worker_id]:
            server = self.server(slot)
            queue = self._pending.get(server)
            for request_id in self._active.pop(slot):
                self._slot_of.pop(request_id, None)
                if queue is not None:
                    queue.pop(request_id, None)
            if server == slot:
                self._pending.pop(slot, None)
                self._last_done.pop(slot, None)
        self.share_compute(worker_id, None)


def _is_domain(server: Hashable) -> bool:
    return isinstance(server, tuple) and len(server) == 2 and server[0] == "domain"
