"""Property tests: random operation sequences on the tree against a brute-force reference model.

Keys are chained like real page keys: a page is named by its whole label path, so every key has
one parent chain. The reference keeps, per location, the set of keys it holds; a match is the
longest run of leading query keys all held, per (holder, dp_rank) and tier class.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from radix_global.locset import TIER_NAMES
from radix_global.ops import HolderMatch, StoreSpan, UnknownParentError
from radix_global.tree import RadixTree
from radix_global.types import Location, PageKey, Tier, WorkerId

# two segments of one store ("s"), and a pool's disk tier (no segment, though it has an "@" less)
HOLDERS = [WorkerId(h) for h in ("w0", "s@a", "s@b", "p+disk")]
LOCATIONS = [Location(h, dp, t) for h in HOLDERS for dp in (0, 1) for t in Tier]
TIER_CLASSES = ((Tier.GPU,), (Tier.GPU, Tier.HOST), tuple(Tier))


def chain(labels: list[int]) -> list[PageKey]:
    """Page keys of a label path: key i identifies labels[: i + 1]."""
    out, prev = [], 0
    for lab in labels:
        prev = hash((prev, lab)) & 0x7FFF_FFFF_FFFF_FFFF
        out.append(PageKey(prev))
    return out


class Reference:
    def __init__(self) -> None:
        self.held: dict[Location, set[int]] = {loc: set() for loc in LOCATIONS}
        self.parent: dict[int, int | None] = {}

    def in_tree(self, key: int) -> bool:
        """A key is in the tree if someone holds it or a page below it."""
        live = set().union(*self.held.values())
        for k in live:
            walk: int | None = k
            while walk is not None:
                if walk == key:
                    return True
                walk = self.parent.get(walk)
        return False

    def store(self, loc: Location, path: list[PageKey], start: int) -> None:
        prev: int | None = None
        for k in path:
            self.parent[k] = prev
            prev = k
        self.held[loc].update(path[start:])

    def match(self, query: list[PageKey]) -> dict[tuple[str, int], HolderMatch]:
        out: dict[tuple[str, int], HolderMatch] = {}
        for h in HOLDERS:
            for dp in (0, 1):
                lengths = []
                for tiers in TIER_CLASSES:
                    have = set().union(*(self.held[Location(h, dp, t)] for t in tiers))
                    n = 0
                    while n < len(query) and query[n] in have:
                        n += 1
                    lengths.append(n)
                if lengths[2]:
                    out[(h, dp)] = HolderMatch(*lengths)
        return out

    def store_runs(self, query: list[PageKey]) -> dict[str, tuple[StoreSpan, ...]]:
        """Spans of the leading pages some segment of store "s" holds at tier POOL."""
        spans: list[StoreSpan] = []
        for page, key in enumerate(query):
            segs = frozenset(h for h in HOLDERS if "@" in h for dp in (0, 1)
                             if key in self.held[Location(h, dp, Tier.POOL)])
            if not segs:
                break
            if spans and spans[-1].segments == segs:
                spans[-1] = StoreSpan(page + 1, segs)
            else:
                spans.append(StoreSpan(page + 1, segs))
        return {"s": tuple(spans)} if spans else {}


labels = st.lists(st.integers(0, 2), min_size=1, max_size=8)
op = st.one_of(
    st.tuples(st.just("store"), st.sampled_from(LOCATIONS), labels, st.integers(0, 7)),
    st.tuples(st.just("remove"), st.sampled_from(LOCATIONS), labels, st.integers(0, 7)),
    st.tuples(st.just("clear"), st.sampled_from(HOLDERS), st.sampled_from([None, *Tier]),
              st.sampled_from([None, 0, 1])),
    st.tuples(st.just("match"), labels),
)


def check_invariants(tree: RadixTree) -> None:
    seen = 0
    for node in tree.iter_nodes():
        seen += 1
        assert node.keys and node.parent is not None
        assert node.locset.locs or node.children, "an empty leaf was not freed"
        assert node.parent.children[node.keys[0]] is node
        for k in node.keys:
            assert tree._table[k] is node
        for h in node.locset.holders:
            assert node in tree._by_holder[h]
    assert seen == tree.node_count
    assert sum(len(n.keys) for n in tree.iter_nodes()) == tree.page_count == len(tree._table)
    for h, nodes in tree._by_holder.items():
        assert nodes and all(h in n.locset.holders and n.parent is not None for n in nodes)
    check_tier_sizes(tree)


def check_tier_sizes(tree: RadixTree) -> None:
    """The counts kept on the location sets equal a walk of the tree."""
    pages, nodes = dict.fromkeys(TIER_NAMES, 0), dict.fromkeys(TIER_NAMES, 0)
    unheld = [0, 0]
    for node in tree.iter_nodes():
        tiers = {"disk" if loc.tier == Tier.POOL and loc.holder.endswith("+disk")
                 else loc.tier.name.lower() for loc in node.locset.locs}
        for tier in tiers:
            pages[tier] += len(node.keys)
            nodes[tier] += 1
        if not tiers:
            unheld[0] += 1
            unheld[1] += len(node.keys)
    assert tree._sets.tier_sizes() == (pages, nodes)
    assert [tree._sets.empty.nodes, tree._sets.empty.pages] == unheld


def run(ops: list[tuple[Any, ...]]) -> tuple[RadixTree, Reference]:
    tree, ref = RadixTree(), Reference()
    for i, o in enumerate(ops):
        kind = o[0]
        if kind == "store":
            _, loc, labs, start = o
            path = chain(labs)
            start = min(start, len(path) - 1)
            parent = path[start - 1] if start else None
            if parent is not None and not ref.in_tree(parent):
                try:
                    tree.store(loc, parent, path[start:])
                    raise AssertionError("unknown parent accepted")
                except UnknownParentError:
                    continue
            tree.store(loc, parent, path[start:])
            ref.store(loc, path, start)
        elif kind == "remove":
            _, loc, labs, start = o
            path = chain(labs)[start:]
            expected_unknown = sum(1 for k in path if k not in ref.held[loc])
            assert tree.remove(loc, path) == expected_unknown
            ref.held[loc].difference_update(path)
        elif kind == "clear":
            _, holder, tier, rank = o
            tree.clear_holder(holder, tier, rank)
            for loc in LOCATIONS:
                if loc.holder == holder and (tier is None or loc.tier == tier) and (
                        rank is None or loc.dp_rank == rank):
                    ref.held[loc].clear()
        else:
            query = chain(o[1])
            got = tree.match(query, now=float(i))
            want = ref.match(query)
            assert got.matched == want
            assert dict(got.store_runs) == ref.store_runs(query)
            best = max((m.pool for m in want.values()), default=0)
            assert got.best_pages == best
            assert got.best_holders == {h for (h, _), m in want.items() if m.pool == best and best}
        check_invariants(tree)
    return tree, ref


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40))
def test_tree_matches_reference_and_frees_everything(ops: list[tuple[Any, ...]]) -> None:
    tree, ref = run(ops)
    for hot in tree.hot_prefixes(top_k=5, now=float(len(ops))):
        assert hot.pages == len(hot.keys) > 0 and hot.hit_rate > 0
        assert ref.parent[hot.keys[0]] is None  # a path from the root
        assert all(ref.parent[b] == a for a, b in itertools.pairwise(hot.keys))
        holding = {
            h
            for h in HOLDERS
            if all(
                any(k in ref.held[loc] for loc in LOCATIONS if loc.holder == h) for k in hot.keys
            )
        }
        assert hot.holders == len(holding)
    for h in HOLDERS:
        tree.clear_holder(h)
        check_invariants(tree)
    assert tree.node_count == 0 and tree.page_count == 0 and not tree._by_holder
    assert tree.root.children == {}


@settings(max_examples=100, deadline=None)
@given(st.lists(op, max_size=40))
def test_removing_every_page_frees_every_node(ops: list[tuple[Any, ...]]) -> None:
    tree, _ = run(ops)
    for node in list(tree.iter_nodes()):
        for loc in node.locset.locs:
            tree.remove(loc, [PageKey(k) for k in node.keys])
    assert tree.node_count == 0 and tree.page_count == 0 and not tree._by_holder


SEGMENT_LOCATIONS = [Location(WorkerId(h), dp, t) for h, dp, t in (
    ("s@a", 0, Tier.POOL), ("s@b", 0, Tier.POOL), ("s@b", 1, Tier.POOL), ("w0", 0, Tier.GPU),
    ("p+disk", 0, Tier.POOL))]
segment_op = st.one_of(
    st.tuples(st.just("store"), st.sampled_from(SEGMENT_LOCATIONS), labels, st.integers(0, 7)),
    st.tuples(st.just("remove"), st.sampled_from(SEGMENT_LOCATIONS), labels, st.integers(0, 7)),
    st.tuples(st.just("match"), labels),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(segment_op, max_size=40))
def test_store_runs_over_segments_match_the_reference(ops: list[tuple[Any, ...]]) -> None:
    """The same check as above, with the locations narrowed to a store's segments (and a worker
    and a disk tier beside them, whose copies split nodes without being segments)."""
    run(ops)


def test_reference_catches_a_broken_match() -> None:
    """Negative control: a tree that forgets tiers must disagree with the reference."""
    ops = [("store", LOCATIONS[1], [0, 1], 0), ("match", [0, 1])]  # w0 dp0 HOST
    run(ops)
    original = RadixTree.match

    def gpu_blind(self: RadixTree, keys: Any, now: float) -> Any:
        r = original(self, keys, now)
        return r._replace(
            matched={k: HolderMatch(m.pool, m.pool, m.pool) for k, m in r.matched.items()}
        )

    RadixTree.match = gpu_blind  # type: ignore[method-assign]
    try:
        try:
            run(ops)
        except AssertionError:
            return
        raise RuntimeError("the reference did not notice a wrong tier class")
    finally:
        RadixTree.match = original  # type: ignore[method-assign]
