"""A radix tree over KV pages recording where each page lives. Pure: no I/O, no clock reads.

Page keys are chained (a key identifies its whole prefix), so every key sits at exactly one place in
the tree. A node holds a compressed run of keys whose pages all share one location set; a node is
split where a prefix diverges (as SGLang's ``RadixCache._split_node``) or where a location covers
only part of the run, and merged back with its single child when their location sets become equal.
``_table`` finds the node of any key in O(1), ``_by_holder`` finds a holder's nodes. A node with no
location and no child is freed at once, so memory follows what the holders really keep.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Iterator, Sequence
from typing import cast

from radix_global.hotness import Decay
from radix_global.locset import HolderRank, LocSet, LocSetInterner
from radix_global.ops import (
    NO_STORE_RUNS,
    HolderMatch,
    HotPrefix,
    IndexRefusal,
    MatchResult,
    StoreSpan,
    UnknownParentError,
)
from radix_global.types import HolderId, Location, PageKey, Tier


class KeyConflictError(IndexRefusal):
    """A store would place a key that already sits elsewhere in the tree (not a chained key)."""

    reason = "key_conflict"


class Node:
    """A run of pages with one location set, a decayed hit count and its last access time."""

    __slots__ = ("children", "hits", "keys", "locset", "parent", "stamp")

    def __init__(
        self, keys: list[int], parent: Node | None, locset: LocSet, hits: float, stamp: float
    ) -> None:
        self.keys = keys
        self.parent = parent  # None for the root and for freed nodes
        self.children: dict[int, Node] = {}  # first key of the child's run -> child
        self.locset = locset
        self.hits = hits  # decayed hits, exact at ``stamp``
        self.stamp = stamp  # last access (match) time, or creation time


class RadixTree:
    """One namespace's tree. Mutations raise ``IndexRefusal`` subclasses before changing state."""

    def __init__(self, decay: Decay | None = None, interner: LocSetInterner | None = None) -> None:
        self.decay = decay or Decay()
        self._sets = interner or LocSetInterner()
        self.root = Node([], None, self._sets.empty, 0.0, 0.0)
        self._table: dict[int, Node] = {}
        self._by_holder: dict[HolderId, set[Node]] = {}
        self.node_count = 0  # not counting the root
        self.clock = 0.0  # latest ``now`` seen; stamps nodes created by stores

    # ---- sizes ----------------------------------------------------------------------------
    @property
    def page_count(self) -> int:
        return len(self._table)

    def holders(self) -> frozenset[HolderId]:
        return frozenset(self._by_holder)

    def __contains__(self, key: int) -> bool:
        return key in self._table

    def footprint_bytes(self) -> int:
        """Bytes held by the tree's own objects (nodes, runs, key ints, table, holder map);
        location sets are shared and left out. ``sys.getsizeof`` accounting, no allocation."""
        size = sys.getsizeof(self._table) + sys.getsizeof(self._by_holder)
        size += sum(sys.getsizeof(s) for s in self._by_holder.values())
        for node in self.iter_nodes():
            size += sys.getsizeof(node) + sys.getsizeof(node.keys) + sys.getsizeof(node.children)
            size += sum(map(sys.getsizeof, node.keys))
        return size

    # ---- mutations ------------------------------------------------------------------------
    def store(self, loc: Location, parent: PageKey | None, keys: Sequence[PageKey]) -> None:
        """``loc`` now holds ``keys`` (prefix order) following ``parent`` (None: the root, or,
        when ``keys[0]`` is already in the tree, wherever it is: a re-store)."""
        if not keys:
            return
        ks = cast(list[int], list(keys))  # a plain list: slices compare at C speed
        table = self._table
        if parent is not None:
            node = table.get(parent)
            if node is None:
                raise UnknownParentError(f"parent page {parent} is not in the tree")
            pos = node.keys.index(parent) + 1
        elif ks[0] in table:
            node = table[ks[0]]
            pos = node.keys.index(ks[0])
        else:
            node, pos = self.root, 0
        # Phase 1 (read only): follow the pages already in the tree, then check the new rest.
        segs: list[tuple[Node, int, int]] = []
        i, n = 0, len(ks)
        while i < n:
            if pos == len(node.keys):
                child = node.children.get(ks[i])
                if child is None:
                    break
                node, pos = child, 0
            run = node.keys
            m = min(len(run) - pos, n - i)
            if run[pos : pos + m] != ks[i : i + m]:
                m = next(j for j in range(m) if run[pos + j] != ks[i + j])
            if m == 0:
                break
            segs.append((node, pos, pos + m))
            i += m
            pos += m
        rest = ks[i:]
        if rest and (len(set(rest)) != len(rest) or any(k in table for k in rest)):
            raise KeyConflictError(f"store of {len(ks)} pages repeats a key found elsewhere")
        # Phase 2: add the location to the existing pages, splitting partly covered runs.
        changed: list[Node] = []
        for seg_node, s, e in segs:
            if loc in seg_node.locset.locs:
                continue
            if e < len(seg_node.keys):
                self._split(seg_node, e)
            target = self._split(seg_node, s) if s > 0 else seg_node
            self._set_locset(target, self._sets.with_loc(target.locset, loc))
            changed.append(target)
            if seg_node is node:  # the attach point moved into the split-off part
                node, pos = target, e - s
        if rest:
            if pos < len(node.keys):
                self._split(node, pos)
            single = self._sets.get((loc,))
            single.pages += len(rest)
            if node is not self.root and not node.children and node.locset is single:
                node.keys.extend(rest)  # the holder's own leaf grows: no new node
                table.update(dict.fromkeys(rest, node))
            else:
                leaf = Node(rest, node, single, 0.0, self.clock)
                node.children[rest[0]] = leaf
                table.update(dict.fromkeys(rest, leaf))
                self._by_holder.setdefault(loc.holder, set()).add(leaf)
                self.node_count += 1
                single.nodes += 1
        for c in changed:
            self._settle(c)

    def remove(self, loc: Location, keys: Sequence[PageKey]) -> int:
        """``loc`` no longer holds ``keys``; returns how many of them it did not hold (ignored)."""
        groups: dict[Node, list[int]] = {}
        unknown = 0
        table = self._table
        for k in keys:
            node = table.get(k)
            if node is None or loc not in node.locset.locs:
                unknown += 1
            else:
                groups.setdefault(node, []).append(k)
        changed: list[Node] = []
        for node, ks in groups.items():
            if len(ks) == 1:
                offsets = [node.keys.index(ks[0])]
            else:
                where = {k: j for j, k in enumerate(node.keys)}
                offsets = sorted({where[k] for k in ks})
            # contiguous ranges, handled from the last so that earlier offsets stay valid
            ranges: list[tuple[int, int]] = []
            for off in offsets:
                if ranges and ranges[-1][1] == off:
                    ranges[-1] = (ranges[-1][0], off + 1)
                else:
                    ranges.append((off, off + 1))
            for s, e in reversed(ranges):
                if e < len(node.keys):
                    self._split(node, e)
                target = self._split(node, s) if s > 0 else node
                self._set_locset(target, self._sets.without_loc(target.locset, loc))
                changed.append(target)
        for c in changed:
            self._settle(c)
        return unknown

    def clear_holder(
        self, holder: HolderId, tier: Tier | None = None, dp_rank: int | None = None
    ) -> int:
        """Drop every location of ``holder`` (at ``tier`` / of ``dp_rank`` only, unless None);
        returns nodes hit."""
        nodes = list(self._by_holder.get(holder, ()))
        for node in nodes:
            self._set_locset(node, self._sets.without_holder(node.locset, holder, tier, dp_rank))
        for node in nodes:
            self._settle(node)
        return len(nodes)

    # ---- queries --------------------------------------------------------------------------
    def match(self, keys: Sequence[PageKey], now: float, hit: bool = True) -> MatchResult:
        """Per (holder, dp_rank), the longest leading run of ``keys`` held, by tier class.
        Counts one decayed hit on every tree node the query walks through, unless ``hit`` is
        False (a planner's lookup, which is no request: it must not make a prefix look hot)."""
        if now > self.clock:
            self.clock = now
        if type(keys) is not list:
            keys = list(keys)  # run slices compare against lists
        k = self.decay.rate_constant
        exp = math.exp
        path: list[tuple[LocSet, int]] = []  # (node's locations, pages of the query before it)
        node, i, n = self.root, 0, len(keys)
        while i < n:
            child = node.children.get(keys[i])
            if child is None:
                break
            run = child.keys
            m = len(run)
            if keys[i : i + m] != run:
                m = min(m, n - i)
                m = next((j for j in range(1, m) if run[j] != keys[i + j]), m)
            if not path or path[-1][0] is not child.locset:  # equal sets change no run
                path.append((child.locset, i))
            # one decayed hit (the rule of radix_global/hotness.py, inline: the router's hot path)
            if not hit:
                pass
            elif now > child.stamp:
                child.hits = child.hits * exp((child.stamp - now) * k) + 1.0
                child.stamp = now
            else:
                child.hits += 1.0
            i += m
            if m < len(run):
                break
            node = child
        gpu: dict[HolderRank, int] = {}
        host: dict[HolderRank, int] = {}
        pool: dict[HolderRank, int] = {}
        if path:
            first = path[0][0]
            alive = [first.gpu, first.host, first.pool]
            for ls, depth in path[1:]:
                steps = ((0, ls.gpu, gpu), (1, ls.host, host), (2, ls.pool, pool))
                for cls, now_set, lengths in steps:
                    was = alive[cls]
                    if now_set is not was and was:
                        for hr in was - now_set:
                            lengths[hr] = depth
                        alive[cls] = was & now_set
            for cls, lengths in ((0, gpu), (1, host), (2, pool)):
                for hr in alive[cls]:
                    lengths[hr] = i
        matched = {hr: HolderMatch(gpu.get(hr, 0), host.get(hr, 0), p) for hr, p in pool.items()}
        best = max(pool.values(), default=0)
        best_holders = frozenset(h for (h, _), p in pool.items() if p == best and best)
        stores = _store_runs(path, i) if path and path[0][0].segments else NO_STORE_RUNS
        return MatchResult(n, matched, best, best_holders, stores)

    def hot_prefixes(self, top_k: int, now: float) -> list[HotPrefix]:
        """The ``top_k`` hottest prefixes: nodes ranked by decayed hit rate, leaving out a node
        whose child carries (nearly) all of its hits, since the longer prefix says more."""
        rate = self.decay.rate
        ranked: list[tuple[float, int, Node]] = []
        for node in self.iter_nodes():
            r = rate(node.hits, node.stamp, now)
            if r <= 0.0 or any(
                rate(c.hits, c.stamp, now) >= 0.99 * r for c in node.children.values()
            ):
                continue
            ranked.append((r, id(node), node))
        out = []
        for r, _, node in heapq.nlargest(top_k, ranked, key=lambda t: t[0]):
            runs: list[list[int]] = []
            holders = node.locset.holders
            walk: Node | None = node
            while walk is not None and walk is not self.root:
                runs.append(walk.keys)
                holders = holders & walk.locset.holders
                walk = walk.parent
            keys = tuple(PageKey(k) for run in reversed(runs) for k in run)
            out.append(HotPrefix(keys, len(keys), r, len(holders)))
        return out

    def iter_nodes(self) -> Iterator[Node]:
        """Every node but the root, depth first, parents before children, children in order."""
        stack = list(reversed(self.root.children.values()))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))

    # ---- structure ------------------------------------------------------------------------
    def _split(self, node: Node, at: int) -> Node:
        """Cut ``node`` after ``at`` pages; the tail becomes its only child and is returned."""
        tail = Node(node.keys[at:], node, node.locset, node.hits, node.stamp)
        tail.children = node.children
        for c in tail.children.values():
            c.parent = tail
        del node.keys[at:]
        node.children = {tail.keys[0]: tail}
        self._table.update(dict.fromkeys(tail.keys, tail))
        for h in node.locset.holders:
            self._by_holder[h].add(tail)
        self.node_count += 1
        node.locset.nodes += 1
        return tail

    def _set_locset(self, node: Node, new: LocSet) -> None:
        old = node.locset
        if new is old:
            return
        for h in old.holders - new.holders:
            nodes = self._by_holder[h]
            nodes.discard(node)
            if not nodes:
                del self._by_holder[h]
        for h in new.holders - old.holders:
            self._by_holder.setdefault(h, set()).add(node)
        n = len(node.keys)
        old.nodes -= 1
        old.pages -= n
        new.nodes += 1
        new.pages += n
        node.locset = new

    def _settle(self, node: Node) -> None:
        """Free ``node`` if it holds nothing, or merge it with an equal single child/parent."""
        root = self.root
        while node is not root and node.parent is not None:
            if not node.locset.locs and not node.children:
                up = node.parent
                self._free(node)
                node = up
                continue
            if len(node.children) == 1:
                (child,) = node.children.values()
                if child.locset is node.locset:
                    self._absorb(node, child)
                    continue
            parent = node.parent
            assert parent is not None
            if parent is root or len(parent.children) != 1 or parent.locset is not node.locset:
                return
            self._absorb(parent, node)
            node = parent

    def _free(self, node: Node) -> None:
        parent = node.parent
        assert parent is not None
        del parent.children[node.keys[0]]
        table = self._table
        for k in node.keys:
            del table[k]
        self._set_locset(node, self._sets.empty)
        self._sets.empty.nodes -= 1
        self._sets.empty.pages -= len(node.keys)
        node.parent = None
        self.node_count -= 1

    def _absorb(self, node: Node, child: Node) -> None:
        """Merge the single ``child`` into ``node`` (same locations); ``node`` keeps its hits."""
        node.keys.extend(child.keys)
        self._table.update(dict.fromkeys(child.keys, node))
        node.children = child.children
        for c in node.children.values():
            c.parent = node
        for h in child.locset.holders:
            self._by_holder[h].discard(child)
        child.parent = None
        self.node_count -= 1
        child.locset.nodes -= 1

    # ---- snapshot support -----------------------------------------------------------------
    def graft(
        self, parent: Node, keys: list[int], locs: frozenset[Location], hits: float, stamp: float
    ) -> Node:
        """Attach a restored node under ``parent`` as is (no merging); for ``restore`` only."""
        if not keys or not self._table.keys().isdisjoint(keys) or keys[0] in parent.children:
            raise KeyConflictError("snapshot node repeats a key")
        node = Node(list(keys), parent, self._sets.empty, hits, stamp)
        self._sets.empty.nodes += 1
        self._sets.empty.pages += len(keys)
        parent.children[keys[0]] = node
        self._table.update(dict.fromkeys(keys, node))
        self._set_locset(node, self._sets.get(locs))
        self.node_count += 1
        return node


def _store_runs(path: list[tuple[LocSet, int]], end: int) -> dict[str, tuple[StoreSpan, ...]]:
    """``MatchResult.store_runs`` from a match's path: (locations, first page) per change of
    location set, the last running to ``end``."""
    spans: dict[str, list[StoreSpan]] = {store: [] for store in path[0][0].segments}
    alive = set(spans)
    ends = [depth for _, depth in path[1:]] + [end]
    for (ls, _), stop in zip(path, ends, strict=True):
        for store in list(alive):
            segs = ls.segments.get(store)
            run = spans[store]
            if segs is None:
                alive.discard(store)  # its run ends where this location set starts
            elif run and run[-1].segments == segs:
                run[-1] = StoreSpan(stop, segs)
            else:
                run.append(StoreSpan(stop, segs))
        if not alive:
            break
    return {store: tuple(run) for store, run in spans.items()}
