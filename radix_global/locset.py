"""Interned location sets: the set of (holder, dp_rank, tier) copies shared by a node's pages.

Nodes along a prefix usually carry the very same set, so sets are interned: equal sets are one
object (compare with ``is``), built once with the per-tier views a match needs, and freed when no
node uses them any more (weak values).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from radix_global.pool_ids import is_disk_holder, is_store_segment, store_of
from radix_global.types import HolderId, Location, Tier

HolderRank = tuple[HolderId, int]
TIER_NAMES = ("gpu", "host", "pool", "disk")  # metric labels; a pool's disk tier apart


def _tier_name(loc: Location) -> str:
    if loc.tier == Tier.POOL and is_disk_holder(loc.holder):
        return "disk"
    return TIER_NAMES[loc.tier - 1]


class LocSet:
    """An immutable, interned set of locations with precomputed views (do not build directly).

    ``nodes`` and ``pages`` are the only mutable fields: how many tree nodes carry this set and
    how many pages those hold, kept by the trees (``RadixTree``) so that sizes by tier need no
    walk of the tree (``LocSetInterner.tier_sizes``)."""

    __slots__ = ("__weakref__", "gpu", "holders", "host", "locs", "nodes", "pages", "pool",
                 "segments", "tiers")

    def __init__(self, locs: frozenset[Location]) -> None:
        self.locs = locs
        self.holders: frozenset[HolderId] = frozenset(loc.holder for loc in locs)
        # (holder, dp_rank) that have the pages at tier GPU / at GPU or HOST / at any tier
        self.gpu: frozenset[HolderRank] = frozenset(
            (loc.holder, loc.dp_rank) for loc in locs if loc.tier == Tier.GPU
        )
        self.host: frozenset[HolderRank] = frozenset(
            (loc.holder, loc.dp_rank) for loc in locs if loc.tier <= Tier.HOST
        )
        self.pool: frozenset[HolderRank] = frozenset((loc.holder, loc.dp_rank) for loc in locs)
        self.tiers: frozenset[str] = frozenset(map(_tier_name, locs))
        segments: dict[str, set[HolderId]] = {}  # store -> its segments holding the pages
        for loc in locs:
            h = loc.holder
            if loc.tier == Tier.POOL and is_store_segment(h):
                segments.setdefault(store_of(h), set()).add(h)
        self.segments: dict[str, frozenset[HolderId]] = {
            store: frozenset(hs) for store, hs in segments.items()}
        self.nodes = 0
        self.pages = 0

    def __repr__(self) -> str:
        return f"LocSet({sorted(self.locs)!r})"


class LocSetInterner:
    """Makes and shares ``LocSet`` objects; one per tree (or shared by several)."""

    __slots__ = ("_cache", "empty")

    def __init__(self) -> None:
        self._cache: weakref.WeakValueDictionary[frozenset[Location], LocSet] = (
            weakref.WeakValueDictionary()
        )
        self.empty = self.get(frozenset())  # held strongly: the empty set is always in use

    def get(self, locs: Iterable[Location]) -> LocSet:
        key = locs if isinstance(locs, frozenset) else frozenset(locs)
        found = self._cache.get(key)
        if found is None:
            found = LocSet(key)
            self._cache[key] = found
        return found

    def with_loc(self, s: LocSet, loc: Location) -> LocSet:
        return s if loc in s.locs else self.get(s.locs | {loc})

    def without_loc(self, s: LocSet, loc: Location) -> LocSet:
        return self.get(s.locs - {loc}) if loc in s.locs else s

    def without_holder(
        self, s: LocSet, holder: HolderId, tier: Tier | None, dp_rank: int | None = None
    ) -> LocSet:
        """``s`` minus every location of ``holder`` (at ``tier`` / of ``dp_rank`` only, unless
        None)."""
        if holder not in s.holders:
            return s
        kept = frozenset(
            loc for loc in s.locs
            if loc.holder != holder or (tier is not None and loc.tier != tier)
            or (dp_rank is not None and loc.dp_rank != dp_rank)
        )
        return s if len(kept) == len(s.locs) else self.get(kept)

    def __len__(self) -> int:
        return len(self._cache)

    def tier_sizes(self) -> tuple[dict[str, int], dict[str, int]]:
        """(pages, nodes) per tier name (every one of ``TIER_NAMES``) over the trees using this
        interner: a page or node with copies at two tiers counts in both."""
        pages = dict.fromkeys(TIER_NAMES, 0)
        nodes = dict.fromkeys(TIER_NAMES, 0)
        for s in list(self._cache.values()):
            for tier in s.tiers:
                pages[tier] += s.pages
                nodes[tier] += s.nodes
        return pages, nodes
