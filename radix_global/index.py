"""The global index: one radix tree per namespace, fed typed operations. Pure: no I/O, no threads.

Contract in ``docs/interfaces.md`` section "Index operations". Every refusal is a typed
``IndexRefusal`` that is raised to the caller AND counted by reason (and logged at debug level), so
a feed that drops events shows up in ``stats()``. ``snapshot()``/``restore()`` use plain data only
(dicts, lists, str, int, float) so a service can serialize it with msgspec.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any, NamedTuple, cast

import msgspec

from radix_global.hotness import DEFAULT_HALF_LIFE_S, Decay
from radix_global.locset import LocSetInterner
from radix_global.ops import (
    ClearHolder,
    HotPrefix,
    IndexOp,
    IndexRefusal,
    MalformedEventError,
    MatchResult,
    PageSizeMismatchError,
    RemovePages,
    StorePages,
    UnknownNamespaceError,
)
from radix_global.tree import Node, RadixTree
from radix_global.types import HolderId, Location, Namespace, PageKey, Tier

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1
_INT64 = (-(2**63), 2**63 - 1)  # page keys (the wire's sint64)
_UINT32_MAX = 2**32 - 1  # dp ranks and page sizes (the wire's uint32)


class IndexStats(NamedTuple):
    namespaces: int
    pages: int  # distinct pages in all trees
    nodes: int
    holders: int  # distinct holders with at least one page
    ops_applied: int
    pages_stored: int  # pages named by applied StorePages
    pages_removed: int  # pages named by applied RemovePages
    unknown_removed: int  # pages named by RemovePages that the location did not hold (ignored)
    refused: dict[str, int]  # refusal reason -> count
    tier_pages: dict[str, int]  # tier name -> distinct pages with a copy there (locset.TIER_NAMES)
    tier_nodes: dict[str, int]  # tier name -> tree nodes with a copy there


class GlobalIndex:
    """Trees by namespace plus counters. Not thread-safe: one owner task drives it."""

    def __init__(self, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        self._decay = Decay(half_life_s)
        self._sets = LocSetInterner()  # shared by all trees: one holder set, one object
        self._trees: dict[Namespace, RadixTree] = {}
        self._page_sizes: dict[Namespace, int] = {}
        self._ops_applied = 0
        self._pages_stored = 0
        self._pages_removed = 0
        self._unknown_removed = 0
        self._refused: Counter[str] = Counter()

    # ---- namespaces -----------------------------------------------------------------------
    def register_namespace(self, namespace: Namespace, page_size: int) -> None:
        """Create the namespace's tree; the first registration fixes its page size."""
        if not isinstance(page_size, int) or page_size <= 0:
            self._refuse(MalformedEventError(f"page size must be a positive int: {page_size!r}"))
        known = self._page_sizes.get(namespace)
        if known is None:
            self._page_sizes[namespace] = page_size
            self._trees[namespace] = RadixTree(self._decay, self._sets)
        elif known != page_size:
            self._refuse(
                PageSizeMismatchError(
                    f"namespace {namespace!r} has page size {known}, not {page_size}"
                )
            )

    def page_size(self, namespace: Namespace) -> int:
        """The namespace's page size; ``UnknownNamespaceError`` if it was never registered."""
        self._tree(namespace)
        return self._page_sizes[namespace]

    def namespaces(self) -> list[Namespace]:
        return list(self._trees)

    # ---- operations -----------------------------------------------------------------------
    def apply(self, op: IndexOp) -> None:
        """Apply one operation; raises (and counts) an ``IndexRefusal`` when it is refused.
        A refused operation changes nothing."""
        try:
            self._apply(op)
        except IndexRefusal as exc:
            self._count(exc)
            raise
        self._ops_applied += 1

    def _apply(self, op: IndexOp) -> None:
        if isinstance(op, StorePages):
            tree = self._tree(op.namespace)
            tree.store(_location(op.location), op.parent, op.keys)
            self._pages_stored += len(op.keys)
        elif isinstance(op, RemovePages):
            tree = self._tree(op.namespace)
            self._unknown_removed += tree.remove(_location(op.location), op.keys)
            self._pages_removed += len(op.keys)
        elif isinstance(op, ClearHolder):
            tier = None if op.tier is None else _tier(op.tier)
            for tree in self._trees.values():
                tree.clear_holder(op.holder, tier, op.dp_rank)
        else:
            raise MalformedEventError(f"not an index operation: {type(op).__name__}")

    def remove_holder(self, holder: HolderId) -> None:
        """A worker or pool left: free all of its entries in every namespace."""
        for tree in self._trees.values():
            tree.clear_holder(holder, None)

    # ---- queries --------------------------------------------------------------------------
    def match(self, namespace: Namespace, keys: Sequence[PageKey], now: float,
              hit: bool = True) -> MatchResult:
        """``RadixTree.match``: ``hit`` False for a lookup that is no request."""
        try:
            return self._tree(namespace).match(keys, now, hit)
        except IndexRefusal as exc:
            self._count(exc)
            raise

    def hot_prefixes(self, namespace: Namespace, top_k: int, now: float) -> list[HotPrefix]:
        try:
            return self._tree(namespace).hot_prefixes(top_k, now)
        except IndexRefusal as exc:
            self._count(exc)
            raise

    def stats(self) -> IndexStats:
        trees = self._trees.values()
        holders: set[HolderId] = set()
        for t in trees:
            holders.update(t.holders())
        tier_pages, tier_nodes = self._sets.tier_sizes()
        return IndexStats(
            namespaces=len(self._trees),
            pages=sum(t.page_count for t in trees),
            nodes=sum(t.node_count for t in trees),
            holders=len(holders),
            ops_applied=self._ops_applied,
            pages_stored=self._pages_stored,
            pages_removed=self._pages_removed,
            unknown_removed=self._unknown_removed,
            refused=dict(self._refused),
            tier_pages=tier_pages,
            tier_nodes=tier_nodes,
        )

    def footprint_bytes(self) -> int:
        """Approximate bytes held by all trees (see ``RadixTree.footprint_bytes``)."""
        return sum(t.footprint_bytes() for t in self._trees.values())

    # ---- snapshot -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain-data copy of every tree: per namespace its page size and its nodes in
        parent-first order as ``[parent_index (-1 = root), keys, [[holder, dp, tier]...],
        hits, stamp]``."""
        spaces = []
        for ns, tree in self._trees.items():
            index_of: dict[int, int] = {id(tree.root): -1}
            nodes: list[list[Any]] = []
            for node in tree.iter_nodes():
                assert node.parent is not None
                index_of[id(node)] = len(nodes)
                locs = sorted([loc.holder, loc.dp_rank, int(loc.tier)] for loc in node.locset.locs)
                nodes.append(
                    [index_of[id(node.parent)], list(node.keys), locs, node.hits, node.stamp]
                )
            spaces.append(
                {
                    "namespace": ns,
                    "page_size": self._page_sizes[ns],
                    "clock": tree.clock,
                    "nodes": nodes,
                }
            )
        return {
            "version": SNAPSHOT_VERSION,
            "half_life_s": self._decay.half_life_s,
            "namespaces": spaces,
        }

    @classmethod
    def restore(cls, data: dict[str, Any], shift_s: float = 0.0) -> GlobalIndex:
        """Rebuild an index from ``snapshot()`` data; raises ``MalformedEventError`` on bad data.
        ``shift_s`` moves every hotness stamp (and each tree's clock): a snapshot taken on
        another clock keeps the ages of its hits, not their absolute times.

        Every value is checked for its type and range (not coerced): what the index holds after a
        restore must be what ``snapshot()`` writes and the wire carries (int64 keys, uint32 dp
        ranks, finite floats), or one bad file would make every later snapshot or answer fail.
        A leaf without a location is refused too (the tree frees such nodes at once)."""
        try:
            if not math.isfinite(shift_s):  # NaN or inf: every stamp would become one
                raise MalformedEventError(f"snapshot clock shift must be finite, got {shift_s}")
            if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION:
                raise MalformedEventError("snapshot version not supported")
            half_life = _number(data["half_life_s"], "half_life_s")
            if half_life <= 0:
                raise MalformedEventError(f"half_life_s must be > 0, got {half_life}")
            index = cls(half_life)
            for space in _list(data["namespaces"], "namespaces"):
                index._restore_space(space, shift_s)
        except IndexRefusal:
            raise
        except Exception as exc:  # RecursionError, MemoryError...: still a bad snapshot
            raise MalformedEventError(f"bad snapshot: {type(exc).__name__}: {exc}"[:300]) from exc
        return index

    def _restore_space(self, space: Any, shift_s: float) -> None:
        if not isinstance(space, dict):
            raise MalformedEventError("a snapshot namespace must be a map")
        ns, page_size = space["namespace"], space["page_size"]
        if not isinstance(ns, str) or ns in self._trees:
            raise MalformedEventError("a snapshot namespace needs a name of its own")
        self.register_namespace(Namespace(ns), _int(page_size, 1, _UINT32_MAX, "page_size"))
        tree = self._trees[Namespace(ns)]
        tree.clock = _shifted(space["clock"], shift_s, "clock")
        made: list[Node] = []
        for node in _list(space["nodes"], "nodes"):
            if not isinstance(node, list) or len(node) != 5:
                raise MalformedEventError("a snapshot node is [parent, keys, locs, hits, stamp]")
            parent_i, keys, locs, hits, stamp = node
            parent_i = _int(parent_i, -1, len(made) - 1, "parent index")
            parent = tree.root if parent_i == -1 else made[parent_i]
            page_keys = _page_keys(keys)
            locations: set[Location] = set()
            for loc in _list(locs, "locations"):
                if not isinstance(loc, list) or len(loc) != 3 or not isinstance(loc[0], str):
                    raise MalformedEventError("a snapshot location is [holder, dp_rank, tier]")
                dp = _int(loc[1], 0, _UINT32_MAX, "dp_rank")
                tier = Tier(_int(loc[2], *_TIERS, "tier"))
                locations.add(Location(cast(HolderId, loc[0]), dp, tier))
            made.append(tree.graft(parent, page_keys, frozenset(locations),
                                   _number(hits, "hits"), _shifted(stamp, shift_s, "stamp")))
        if any(not n.locset.locs and not n.children for n in made):
            raise MalformedEventError("a snapshot leaf holds no location")

    # ---- helpers --------------------------------------------------------------------------
    def _tree(self, namespace: Namespace) -> RadixTree:
        tree = self._trees.get(namespace)
        if tree is None:
            raise UnknownNamespaceError(f"namespace {namespace!r} is not registered")
        return tree

    def _count(self, exc: IndexRefusal) -> None:
        self._refused[exc.reason] += 1
        log.debug("index refused (%s): %s", exc.reason, exc)

    def _refuse(self, exc: IndexRefusal) -> None:
        self._count(exc)
        raise exc


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedEventError(f"snapshot {what} must be a list")
    return value


_TIERS = (min(Tier), max(Tier))
_PAGE_KEYS = list[Annotated[int, msgspec.Meta(ge=_INT64[0], le=_INT64[1])]]


def _page_keys(value: Any) -> list[int]:
    """A node's page keys, each an int64 (not a bool, not a float), checked in one C pass: a
    restore checks every key of the index, 10M of them at 10M pages."""
    try:
        keys: list[int] = msgspec.convert(_list(value, "keys"), _PAGE_KEYS, strict=True)
    except msgspec.ValidationError as exc:
        raise MalformedEventError(f"snapshot page key must be an int in [{_INT64[0]}, "
                                  f"{_INT64[1]}]: {exc}") from None
    return keys


def _int(value: Any, lo: int, hi: int, what: str) -> int:
    if type(value) is not int or not lo <= value <= hi:  # not bool, not float: exact data
        raise MalformedEventError(f"snapshot {what} must be an int in [{lo}, {hi}]")
    return value


def _number(value: Any, what: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise MalformedEventError(f"snapshot {what} must be a finite number")
    return float(value)


def _shifted(value: Any, shift_s: float, what: str) -> float:
    """A stamp moved onto this process's clock; it must stay finite (a huge stamp plus a huge
    shift overflows), or the next snapshot of this index would be unreadable."""
    out = _number(value, what) + shift_s
    if not math.isfinite(out):
        raise MalformedEventError(f"snapshot {what} is out of range once shifted by {shift_s}")
    return out


def _tier(tier: int) -> Tier:
    try:
        return Tier(tier)
    except ValueError as exc:
        raise MalformedEventError(f"unknown tier {tier!r}") from exc


def _location(loc: Location) -> Location:
    """Normalise the tier to ``Tier`` so equal locations hash alike; refuse unknown tiers."""
    if type(loc.tier) is Tier:
        return loc
    return Location(loc.holder, loc.dp_rank, _tier(loc.tier))
