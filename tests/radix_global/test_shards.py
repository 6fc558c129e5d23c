"""Sharding by chain head: one prompt's pages on one shard, answers equal to an unsharded index."""

from __future__ import annotations

import random

import pytest

from radix_global.index import GlobalIndex
from radix_global.keys import page_keys
from radix_global.ops import ClearHolder, IndexOp, RemovePages, StorePages, UnknownParentError
from radix_global.shards import ShardedIndex
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId

NS = Namespace("tiny@1")
PAGE = 4
WORKERS = [WorkerId(f"sgl-{i}") for i in range(3)]


def _prompts(rng: random.Random, n: int) -> list[list[PageKey]]:
    """Prompts of 2..12 pages; half share one of a few system prefixes (shared chain heads)."""
    systems = [[rng.randrange(1000) for _ in range(PAGE * 3)] for _ in range(3)]
    out = []
    for _ in range(n):
        body = [rng.randrange(1000) for _ in range(PAGE * rng.randint(2, 9))]
        tokens = (rng.choice(systems) + body) if rng.random() < 0.5 else body
        out.append(page_keys(tokens, PAGE))
    return out


def _ops(rng: random.Random, prompts: list[list[PageKey]]) -> list[IndexOp]:
    """Each prompt stored by a random worker in two pieces (the second continues the first), at a
    random tier; then some removals and a tier clear: the event shapes an engine publishes."""
    ops: list[IndexOp] = []
    for keys in prompts:
        loc = Location(rng.choice(WORKERS), rng.randrange(2), rng.choice(list(Tier)))
        cut = rng.randint(1, len(keys) - 1)
        ops.append(StorePages(NS, loc, None, keys[:cut]))
        ops.append(StorePages(NS, loc, keys[cut - 1], keys[cut:]))
    for keys in rng.sample(prompts, len(prompts) // 4):
        loc = Location(rng.choice(WORKERS), rng.randrange(2), rng.choice(list(Tier)))
        ops.append(RemovePages(NS, loc, keys[-2:]))
    ops.append(ClearHolder(WORKERS[0], Tier.HOST))
    return ops


def _build(ops: list[IndexOp], *indexes: GlobalIndex | ShardedIndex) -> None:
    for index in indexes:
        index.register_namespace(NS, PAGE)
        for op in ops:
            index.apply(op)


def _queries(rng: random.Random, prompts: list[list[PageKey]]) -> list[list[PageKey]]:
    qs = [list(p) for p in prompts] + [p[: rng.randint(1, len(p))] for p in prompts]
    qs += [[*p[:2], PageKey(rng.getrandbits(63))] for p in prompts[:10]]  # diverges
    return [*qs, [PageKey(rng.getrandbits(63))], []]


def _two_shard_setup(seed: int = 7) -> tuple[GlobalIndex, ShardedIndex, list[list[PageKey]]]:
    rng = random.Random(seed)
    prompts = _prompts(rng, 60)
    flat, sharded = GlobalIndex(), ShardedIndex([GlobalIndex(), GlobalIndex()])
    _build(_ops(rng, prompts), flat, sharded)
    return flat, sharded, prompts


def test_all_pages_of_a_prompt_are_on_one_shard() -> None:
    _, sharded, prompts = _two_shard_setup()
    used = set()
    for keys in prompts:
        holding = [i for i, s in enumerate(sharded.shards) if any(k in s._trees[NS] for k in keys)]
        assert len(holding) <= 1, f"prompt split over shards {holding}"
        if holding:
            used.add(holding[0])
            assert holding[0] == sharded.shard_of_chain(NS, keys[0])
    assert used == {0, 1}, "two shards must both get prompts for the test to mean anything"


def test_matches_equal_an_unsharded_index() -> None:
    flat, sharded, prompts = _two_shard_setup()
    queries = _queries(random.Random(1), prompts)
    hits = 0
    for q in queries:
        got, want = sharded.match(NS, q, now=10.0), flat.match(NS, q, now=10.0)
        assert got == want
        hits += want.best_pages > 0
    assert hits > len(prompts), "the comparison must cover real matches, not only misses"
    for holder in (WORKERS[1], WORKERS[2]):
        flat.remove_holder(holder)
        sharded.remove_holder(holder)
    for q in queries:
        assert sharded.match(NS, q, now=20.0) == flat.match(NS, q, now=20.0)


def test_hot_prefixes_and_stats_equal_an_unsharded_index() -> None:
    flat, sharded, prompts = _two_shard_setup()
    for q in prompts[:20]:
        flat.match(NS, q, now=5.0)
        sharded.match(NS, q, now=5.0)
    want = flat.hot_prefixes(NS, 8, now=6.0)
    got = sharded.hot_prefixes(NS, 8, now=6.0)
    assert [p.hit_rate for p in got] == pytest.approx([p.hit_rate for p in want])
    assert {p.keys for p in got if p.hit_rate > want[-1].hit_rate} == {
        p.keys for p in want if p.hit_rate > want[-1].hit_rate
    }
    fs, ss = flat.stats(), sharded.stats()
    assert ss["pages"] == fs.pages and ss["nodes"] == fs.nodes
    assert ss["shards"] == 2 and len(ss["per_shard"]) == 2
    assert ss["per_shard"][0]["pages"] > 0 and ss["per_shard"][1]["pages"] > 0


def test_store_after_an_unknown_parent_is_refused_and_counted() -> None:
    sharded = ShardedIndex([GlobalIndex(), GlobalIndex()])
    sharded.register_namespace(NS, PAGE)
    loc = Location(WORKERS[0], 0, Tier.GPU)
    with pytest.raises(UnknownParentError):
        sharded.apply(StorePages(NS, loc, PageKey(12345), [PageKey(1)]))
    assert sharded.stats()["router_refused"] == {"unknown_parent": 1}


def test_snapshot_round_trip_keeps_routing() -> None:
    flat, sharded, prompts = _two_shard_setup()
    back = ShardedIndex.restore(sharded.snapshot())
    for q in _queries(random.Random(2), prompts):
        assert back.match(NS, q, now=10.0) == flat.match(NS, q, now=10.0)
    # A continuation stored after the restore still finds its chain's shard.
    loc = Location(WORKERS[1], 0, Tier.GPU)
    extra = PageKey(424242)
    prompt = next(p for p in prompts if flat.match(NS, p, 10.0).best_pages >= 2)
    head = prompt[: flat.match(NS, prompt, 10.0).best_pages]
    for index in (flat, back):
        index.apply(StorePages(NS, loc, head[-1], [extra]))
    q = [*head, extra]
    assert back.match(NS, q, now=11.0) == flat.match(NS, q, now=11.0)
    assert flat.match(NS, q, now=11.0).best_pages == len(q)


def test_negative_control_routing_continuations_by_their_own_key_breaks_equality(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guards the chain-head map: routing a continuation by its parent's hash (no map) must make
    the comparison test fail, otherwise that test could not catch a routing bug."""

    def naive(self: ShardedIndex, op: StorePages) -> int:
        head = op.keys[0] if op.parent is None else op.parent
        return head % len(self.shards)

    monkeypatch.setattr(ShardedIndex, "_store_shard", naive)
    rng = random.Random(7)
    prompts = _prompts(rng, 60)
    flat, sharded = GlobalIndex(), ShardedIndex([GlobalIndex(), GlobalIndex()])
    refused = 0
    flat.register_namespace(NS, PAGE)
    sharded.register_namespace(NS, PAGE)
    for op in _ops(rng, prompts):
        flat.apply(op)
        try:
            sharded.apply(op)
        except UnknownParentError:
            refused += 1
    differ = sum(sharded.match(NS, p, 10.0) != flat.match(NS, p, 10.0) for p in prompts)
    assert refused > 0 and differ > 0
