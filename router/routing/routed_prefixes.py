"""What this router sent where: per slot, the page keys of prompts it routed there, and when.

A slot will hold a routed prompt's pages once that prompt's prefill is done, long before the
engine's KV events say so (a busy CPU engine publishes them seconds later, after the batch). A
multi-turn conversation's next turn often arrives in that window; without this memory it looks
cold everywhere and is priced by load alone. ``approx_cache`` uses it as its whole view of the
cluster (engines without events, like SGLang router's ``cache_aware``); ``conductor`` uses it next
to the index, for ``ttl_s`` seconds or until ``settle_s`` after the request finished (``settle``),
whichever comes first; then the index (events, evictions) is the only truth. Under cache pressure
an engine evicts a finished prompt's pages within seconds, and only its events say so.

Page keys are chained hashes: a key stands for its whole prefix, so a slot's "tree" is a set and
its match is the leading run of the prompt's keys it holds. Each slot's memory is an LRU bounded
at ``max_pages_per_slot`` (no eviction signal otherwise). Pure: time is passed in.

Other routers' routings arrive as *tips*: a routed prompt's last page key and its slot
(``docs/interfaces.md``, "Several routers, one view", routed, not yet in the index). A request
whose keys contain a tip has the tip's whole prefix there; :meth:`RoutedPrefixes.tips` finds
them in one scan of the request's keys, whatever the number of slots.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set

from radix_global.types import PageKey, WorkerId

Slot = tuple[WorkerId, int]


class RoutedPrefixes:
    def __init__(self, max_pages_per_slot: int = 100_000, ttl_s: float | None = None,
                 max_tips: int = 100_000) -> None:
        """``ttl_s``: forget a page this long after it was last routed (None: LRU bound only)."""
        if max_pages_per_slot < 1 or max_tips < 1:
            raise ValueError("max_pages_per_slot and max_tips must be >= 1")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError("ttl_s must be > 0 (or None)")
        self.max_pages_per_slot = max_pages_per_slot
        self.ttl_s = ttl_s
        self._pages: dict[Slot, OrderedDict[PageKey, float]] = {}  # key -> expiry time
        # a routed prompt's first page key -> the slots holding it: a request's holders are
        # found from its first key, not by asking every slot
        self._heads: dict[PageKey, set[Slot]] = {}
        # a peer's routed prompt's last page -> slot -> expiry; least recent first
        self._tips: OrderedDict[PageKey, dict[Slot, float]] = OrderedDict()
        self.max_tips = max_tips

    def add(self, slot: Slot, keys: Sequence[PageKey], now: float) -> None:
        """``keys`` (one prompt, in order) were routed to ``slot`` at ``now``."""
        if not keys:
            return
        held = self._pages.setdefault(slot, OrderedDict())
        expiry = float("inf") if self.ttl_s is None else now + self.ttl_s
        # Deepest page first, so the prefix ends up most recent and the LRU trims leaves first.
        for key in reversed(keys):
            held[key] = expiry
            held.move_to_end(key)
        self._heads.setdefault(keys[0], set()).add(slot)
        while len(held) > self.max_pages_per_slot:
            self._unhead(held.popitem(last=False)[0], slot)
        self._expire(slot, held, now)

    def settle(self, slot: Slot, keys: Sequence[PageKey], now: float, within_s: float) -> None:
        """``keys`` were computed on ``slot`` (the request finished): the engine's events for
        them are out within ``within_s``, so stop standing in for the index after that."""
        held = self._pages.get(slot)
        if held:
            until = now + within_s
            for key in keys:
                if key in held and held[key] > until:
                    held[key] = until

    def match(self, slot: Slot, keys: Sequence[PageKey], now: float) -> int:
        """Leading pages of ``keys`` routed to ``slot`` and not expired at ``now``."""
        held = self._pages.get(slot)
        if not held:
            return 0
        count = 0
        for key in keys:
            t = held.get(key)
            if t is None or t < now:
                break
            count += 1
        return count

    def holders(self, keys: Sequence[PageKey], now: float) -> list[Slot]:
        """The slots where :meth:`match` of ``keys`` is not 0, found from the first key."""
        if not keys:
            return []
        key = keys[0]
        return [slot for slot in self._heads.get(key, ())
                if self._pages[slot].get(key, -1.0) >= now]

    def add_tip(self, slot: Slot, tip: PageKey, now: float, ttl_s: float) -> None:
        """Another router routed a prompt whose last page key is ``tip`` to ``slot`` at
        ``now``; it counts for ``ttl_s``."""
        self._tips.setdefault(tip, {})[slot] = now + ttl_s
        self._tips.move_to_end(tip)
        while len(self._tips) > self.max_tips:
            self._tips.popitem(last=False)

    def tips(self, keys: Sequence[PageKey], now: float) -> dict[Slot, int]:
        """Per slot, the most leading pages of ``keys`` that another router's routed prompt
        ending there covers (none: empty)."""
        out: dict[Slot, int] = {}
        if not self._tips:
            return out
        for i in range(len(keys) - 1, -1, -1):
            found = self._tips.get(keys[i])
            if found is None:
                continue
            for slot, expiry in found.items():
                if expiry >= now and slot not in out:
                    out[slot] = i + 1
        return out

    def slots(self) -> Set[Slot]:
        """The slots some prefix was routed to (a view: read it, do not keep it)."""
        return self._pages.keys()

    def pages(self, slot: Slot) -> int:
        return len(self._pages.get(slot, ()))

    def forget_worker(self, worker_id: WorkerId) -> None:
        for slot in [s for s in self._pages if s[0] == worker_id]:
            for key in self._pages.pop(slot):
                self._unhead(key, slot)
        for tip in [t for t, slots in self._tips.items() if any(s[0] == worker_id for s in slots)]:
            kept = {s: v for s, v in self._tips[tip].items() if s[0] != worker_id}
            if kept:
                self._tips[tip] = kept
            else:
                del self._tips[tip]

    def _expire(self, slot: Slot, held: OrderedDict[PageKey, float], now: float) -> None:
        # Least recently routed first; stop at the first page not expired (a settled page
        # further on is dropped by a later call, and ``match`` ignores it meanwhile).
        while held:
            key, t = next(iter(held.items()))
            if t >= now:
                break
            del held[key]
            self._unhead(key, slot)

    def _unhead(self, key: PageKey, slot: Slot) -> None:
        slots = self._heads.get(key)
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self._heads[key]
