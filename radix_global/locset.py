"""Interned location sets: the set of (holder, dp_rank, tier) copies shared by a node's pages.

Nodes along a prefix usually carry the very same set, so sets are interned: equal sets are one
object (compare with ``is``), built once with the per-tier views a match needs, and freed when no
node uses them any more (weak values).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from radix_global.types import HolderId, Location, Tier

HolderRank = tuple[HolderId, int]


class LocSet:
    """An immutable, interned set of locations with precomputed views (do not build directly)."""

    __slots__ = ("__weakref__", "gpu", "holders", "host", "locs", "pool")

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
