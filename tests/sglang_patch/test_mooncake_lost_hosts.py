"""Reads around a lost host (docs/interfaces.md, "Mooncake Store as the L3 pool"): the pure
bookkeeping, and MooncakePagePool skipping what sits on a host a read failed on."""

from __future__ import annotations

import numpy as np
import pytest
from fake_mooncake import FakeStore

from sglang_patch.pool.base import PageIO
from sglang_patch.pool.lost_hosts import LostHosts, host_of
from sglang_patch.pool.mooncake_pool import MIN_SEGMENT_BYTES, MooncakePagePool

PAGE = 4096


def test_a_failed_read_loses_the_replicas_hosts_but_ours_and_only_for_a_while() -> None:
    now = [0.0]
    lost = LostHosts("10.0.0.2:15000", hold_s=60, clock=lambda: now[0])
    assert not lost.known() and host_of("[::1]:7") == "[::1]"
    lost.failed(["10.0.0.3:16000", "10.0.0.4:16000"])  # two replicas: which one failed?
    assert lost.hosts() == []
    lost.failed(["10.0.0.3:16000", "10.0.0.2:16000"])  # ours and one other: that one
    assert lost.hosts() == ["10.0.0.3"]
    lost.failed(["10.0.0.3:16000", "10.0.0.4:16000"])  # explained by the lost one
    assert lost.hosts() == ["10.0.0.3"]
    assert lost.unreadable(["10.0.0.3:17000"])
    # a live replica elsewhere beside the lost one: Mooncake may pick the dead one
    assert lost.unreadable(["10.0.0.3:17000", "10.0.0.4:1"])
    assert not lost.unreadable(["10.0.0.3:17000", "10.0.0.2:1"])  # ours is read
    assert not lost.unreadable([])  # nothing listed: the read itself says
    now[0] = 61.0
    assert not lost.known() and not lost.unreadable(["10.0.0.3:17000"])


def keyed_pool(store: FakeStore) -> MooncakePagePool:
    return MooncakePagePool("mooncake-m-1@10.0.0.2:1", PAGE, "m:1", "10.0.0.2", MIN_SEGMENT_BYTES,
                            store_factory=lambda: store)


def run(p: MooncakePagePool, keys: list[str]) -> list[bool]:
    dest = [[np.zeros(PAGE, np.uint8)] for _ in keys]
    return p.get_many([PageIO(k, d) for k, d in zip(keys, dest, strict=True)])


@pytest.mark.parametrize("dead", [True, False])
def test_after_one_failed_batch_the_lost_hosts_pages_are_not_read_again(dead: bool) -> None:
    """Pages k0..k7, k2..k7 on host 10.0.0.3. That host dies: the first batch reads k2 alone
    first (a host not read from lately), which fails (slowly, in the real store); the rest of
    the batch stops before k2, and after it exists() says no and no read reaches the dead host
    again. The control: a live host, every page read."""
    store = FakeStore()
    p = keyed_pool(store)
    keys = [f"k{i}" for i in range(8)]
    for i, k in enumerate(keys):
        p.put(k, [np.full(PAGE, i, np.uint8)], tag=i)
        if i >= 2:
            store.where[k] = "10.0.0.3:16000"
    if dead:
        store.dead_hosts.add("10.0.0.3")
    first = run(p, keys)
    assert first == ([True, True] + [False] * 6 if dead else [True] * 8)
    assert p.lost_hosts() == (["10.0.0.3"] if dead else [])
    # the unseen host was probed with one key alone: one stalled read, not six
    assert store.dead_reads == (1 if dead else 0)
    assert run(p, keys) == first
    assert [p.exists(k) for k in keys] == first
    assert store.dead_reads == (1 if dead else 0)  # not one more read of the lost host
    assert p._counts["lost_skips"] == (5 + 6 + 6 if dead else 0)


def test_a_host_the_router_says_is_lost_is_not_read_even_once() -> None:
    """The router's word comes before any failed read: no read reaches the dead host; when the
    router no longer says it, its pages are read again."""
    store = FakeStore()
    p = keyed_pool(store)
    keys = [f"k{i}" for i in range(4)]
    for i, k in enumerate(keys):
        p.put(k, [np.full(PAGE, i, np.uint8)], tag=i)
        store.where[k] = "10.0.0.3:16000" if i >= 1 else "10.0.0.2:16000"
    store.dead_hosts.add("10.0.0.3")
    p.told_lost(["10.0.0.3", "10.0.0.2"])  # our own host is never lost
    assert p.lost_hosts() == ["10.0.0.3"]
    assert [p.exists(k) for k in keys] == [True, False, False, False]
    assert run(p, keys) == [True, False, False, False] and store.dead_reads == 0
    store.dead_hosts.clear()  # it came back
    p.told_lost([])
    assert run(p, keys) == [True] * 4


def test_the_plan_probes_one_key_per_unseen_host_and_cuts_at_the_first_lost_one() -> None:
    now = [100.0]
    lost = LostHosts("10.0.0.2:1", clock=lambda: now[0])
    where = {"a": ["10.0.0.2:9"], "b": ["10.0.0.3:9"], "c": ["10.0.0.3:9"],
             "d": ["10.0.0.4:9", "10.0.0.3:9"], "e": ["10.0.0.5:9"]}
    keys = list("abcde")
    assert lost.plan(keys, where) == (5, [1, 4])  # ours never; 3 first at b; d is on two
    lost.seen(["10.0.0.3:9"])
    assert lost.plan(keys, where) == (5, [4])
    now[0] += 11  # seen too long ago: probed again
    lost.failed(["10.0.0.4:9"])
    assert lost.plan(keys, where) == (3, [1])  # d has a replica on the lost host: cut there
    assert lost.plan(["x"], {}) == (1, [])  # nothing known: read as it comes


def test_a_key_with_several_replicas_neither_probes_nor_vouches_for_a_host() -> None:
    """Mooncake picks the replica it reads: a read of a key on two hosts says nothing about
    either, so it is no probe and marks neither as answering."""
    lost = LostHosts("10.0.0.2:1", clock=lambda: 0.0)
    where = {"a": ["10.0.0.3:9", "10.0.0.4:9"], "b": ["10.0.0.4:9"]}
    assert lost.plan(["a", "b"], where) == (2, [1])
    lost.seen(where["a"])
    assert lost.plan(["a", "b"], where) == (2, [1])
    lost.seen(where["b"])
    assert lost.plan(["a", "b"], where) == (2, [])
