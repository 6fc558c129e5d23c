"""The load view: what every router has in flight on each slot (``docs/interfaces.md``, "Several
routers, one view", the load view). Pure: time is the ``now`` the caller passes.

A router's own work is its cost model's (``QueueModel``), decode reservations and dispatch gate;
:func:`own_loads` gathers it into :class:`SlotLoad` per slot, which the coordination link
(``router/coordination/link.py``) publishes. :class:`PeerLoads` keeps the other routers' last
publications and their per-slot sum, updated when a publication arrives (so a decision reads
one slot in O(1), never every router's record); a publication older than ``expire_s`` (its
router is silent or dead) stops counting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from typing import NamedTuple

from radix_global.types import WorkerId
from router.routing.queue_model import Slot


class SlotLoad(NamedTuple):
    """In-flight work on one slot. ``age_s``: how old the oldest reading in it is (0: own)."""

    requests: int = 0  # routed, not finished (prefill or decode)
    prefilling: int = 0  # routed, first token not yet back
    prefill_tokens: int = 0  # their prompt tokens still to compute (beyond the cached prefix)
    decode_tokens: int = 0  # decode KV reserved (prefill/decode disaggregation)
    held: int = 0  # held by a dispatch gate for this slot
    age_s: float = 0.0

    def plus(self, other: SlotLoad) -> SlotLoad:
        return SlotLoad(self.requests + other.requests, self.prefilling + other.prefilling,
                        self.prefill_tokens + other.prefill_tokens,
                        self.decode_tokens + other.decode_tokens, self.held + other.held,
                        max(self.age_s, other.age_s))

    def minus(self, other: SlotLoad) -> SlotLoad:
        return SlotLoad(self.requests - other.requests, self.prefilling - other.prefilling,
                        self.prefill_tokens - other.prefill_tokens,
                        self.decode_tokens - other.decode_tokens, self.held - other.held)

    @property
    def empty(self) -> bool:
        return not (self.requests or self.prefilling or self.prefill_tokens
                    or self.decode_tokens or self.held)


NO_LOAD = SlotLoad()


def own_loads(active: Mapping[Slot, int], prefills: Mapping[Slot, tuple[int, int]],
              decode_tokens: Mapping[Slot, int], held: Iterable[Slot],
              released: Iterable[Slot] = ()) -> dict[Slot, SlotLoad]:
    """One router's work per slot from its parts: requests routed and not finished, (prefills
    without a first token, their tokens to compute), decode reservations, gate-held requests by
    the slot their policy placed them on, and requests the gate released to a slot and not yet
    routed (a request and a prefill there each: the room they are about to take)."""
    held_per, released_per = Counter(held), Counter(released)
    out: dict[Slot, SlotLoad] = {}
    for slot in set(active) | set(prefills) | set(decode_tokens) | set(held_per) \
            | set(released_per):
        n, tokens = prefills.get(slot, (0, 0))
        going = released_per[slot]
        load = SlotLoad(active.get(slot, 0) + going, n + going, tokens,
                        decode_tokens.get(slot, 0), held_per[slot])
        if not load.empty:
            out[slot] = load
    return out


class _Peer(NamedTuple):
    seq: int
    at: float  # when this router received it
    slots: dict[Slot, SlotLoad]


class PeerLoads:
    """The other routers' published load, summed per slot."""

    def __init__(self, expire_s: float) -> None:
        if expire_s <= 0:
            raise ValueError(f"expire_s must be > 0, got {expire_s}")
        self.expire_s = expire_s
        self._peers: dict[str, _Peer] = {}
        self._total: dict[Slot, SlotLoad] = {}
        self._oldest: float | None = None  # receive time of the oldest publication counted

    def update(self, router_id: str, seq: int, slots: Mapping[Slot, SlotLoad],
               now: float) -> int | None:
        """Count ``slots`` (a peer's publication number ``seq``) instead of that peer's previous
        one: how many of its prefills ended since plus the slots it no longer holds requests for
        (room a request held here may take: freed, or no longer shared with it); None if it is
        not newer than the one counted (a notice for an older write)."""
        old = self._peers.get(router_id)
        if old is not None and seq <= old.seq:
            return None
        kept = {slot: load for slot, load in slots.items()
                if min(load[:5]) >= 0 and slot[1] >= 0}  # never a negative contribution
        self._drop(router_id)
        self._peers[router_id] = _Peer(seq, now, kept)
        for slot, load in kept.items():
            self._total[slot] = self._total.get(slot, NO_LOAD).plus(load)
        self._oldest = min(p.at for p in self._peers.values())
        if old is None:
            return 0
        gave = 0
        for slot, load in old.slots.items():
            now_load = kept.get(slot, NO_LOAD)
            gave += max(0, load.prefilling - now_load.prefilling) \
                + (load.held > 0 and now_load.held == 0)
        return gave

    def refreshed(self, router_id: str, now: float) -> None:
        """The peer's record is unchanged and still live (its key was refreshed)."""
        peer = self._peers.get(router_id)
        if peer is not None:
            self._peers[router_id] = peer._replace(at=now)
            self._oldest = min(p.at for p in self._peers.values())

    def drop(self, router_id: str) -> None:
        self._drop(router_id)
        self._oldest = min((p.at for p in self._peers.values()), default=None)

    def _drop(self, router_id: str) -> None:
        old = self._peers.pop(router_id, None)
        if old is None:
            return
        for slot, load in old.slots.items():
            left = self._total[slot].minus(load)
            if left.empty:
                del self._total[slot]
            else:
                self._total[slot] = left

    def expire(self, now: float) -> list[str]:
        """Stop counting peers whose last publication is older than ``expire_s``."""
        gone = [rid for rid, p in self._peers.items() if now - p.at > self.expire_s]
        for rid in gone:
            self.drop(rid)
        return gone

    def load(self, slot: Slot, now: float) -> SlotLoad:
        """The peers' work on ``slot`` (all zero when none)."""
        total = self._total.get(slot)
        if total is None:
            return NO_LOAD
        return total._replace(age_s=now - self._oldest if self._oldest is not None else 0.0)

    def waiting(self, slot: Slot) -> list[str]:
        """The peers holding requests for ``slot`` (their dispatch gates wait for room there)."""
        return [rid for rid, peer in self._peers.items()
                if (load := peer.slots.get(slot)) is not None and load.held > 0]

    def slots(self) -> list[Slot]:
        """The slots some peer has work on."""
        return list(self._total)

    def routers(self) -> list[str]:
        return sorted(self._peers)

    def counted(self) -> Collection[str]:
        """The peers whose publication counts now (a view: read it, do not keep it)."""
        return self._peers.keys()

    def forget_worker(self, worker_id: WorkerId) -> None:
        """A worker left: its slots stop counting until a peer publishes them again."""
        for slot in [s for s in self._total if s[0] == worker_id]:
            del self._total[slot]
        for rid, peer in self._peers.items():
            if any(s[0] == worker_id for s in peer.slots):
                self._peers[rid] = peer._replace(
                    slots={s: x for s, x in peer.slots.items() if s[0] != worker_id})
