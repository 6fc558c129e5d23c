"""MooncakePagePool's own logic against a fake client (the real store: test_mooncake_pool.py):
error codes, the checksum, the written-page bookkeeping, clear and close."""

from __future__ import annotations

import numpy as np
import pytest
from fake_mooncake import FakeStore

from sglang_patch.pool.base import PageIO, PoolError
from sglang_patch.pool.mooncake_calls import BATCH_BUFFERS, ZERO_COPY_MIN_CHUNK
from sglang_patch.pool.mooncake_pool import MIN_SEGMENT_BYTES, MooncakePagePool

PAGE = 4096


def pool(store: FakeStore, segment: int = MIN_SEGMENT_BYTES,
         zero_copy_min_chunk: int = ZERO_COPY_MIN_CHUNK) -> MooncakePagePool:
    return MooncakePagePool("mooncake-m-1@10.0.0.2:1", PAGE, "m:1", "10.0.0.2", segment,
                            store_factory=lambda: store, zero_copy_min_chunk=zero_copy_min_chunk)


def page(i: int) -> list[np.ndarray]:
    return list(np.split(np.random.default_rng(i).integers(0, 256, PAGE, np.uint8), 4))


def read(p: MooncakePagePool, key: str) -> np.ndarray | None:
    dest = [np.zeros(PAGE // 4, np.uint8) for _ in range(4)]
    return np.concatenate(dest) if p.get_into(key, dest) else None


def test_round_trip_existing_keys_and_errors_are_misses() -> None:
    store = FakeStore()
    p = pool(store)
    assert p.put("k1", page(1), tag=1) == (True, True, ())
    assert p.put("k1", page(2), tag=1) == (True, False, ())  # exists: not written again
    got = read(p, "k1")
    assert got is not None and (got == np.concatenate(page(1))).all()
    assert read(p, "missing") is None  # a negative return code, never a size
    store.fail_puts = True
    assert p.put("k2", page(2), tag=2) == (False, False, ())
    assert p.put("big", [np.zeros(PAGE + 1, np.uint8)]).stored is False
    with pytest.raises(PoolError, match="at least 16 MiB"):
        pool(FakeStore(), segment=MIN_SEGMENT_BYTES - 1)


def test_a_corrupt_page_is_a_miss_and_is_removed() -> None:
    store = FakeStore()
    p = pool(store)
    p.put("k", page(3), tag=3)
    bad = bytearray(store.objects["k"])
    bad[10] ^= 0xFF
    store.objects["k"] = bytes(bad)
    assert read(p, "k") is None and "k" not in store.objects
    assert p.stats().checksum_failures == 1
    assert p.put("k", page(3), tag=3).new  # written anew, not kept corrupt


def test_vanished_names_what_the_store_lost_and_forgets_beyond_a_segment() -> None:
    store = FakeStore()
    p = pool(store)
    n = p.capacity_pages + 5
    for i in range(n):
        p.put(f"k{i}", page(i % 7), tag=i)
    del store.objects["k10"]  # evicted silently
    gone = p.vanished(limit=20)
    # the first 5 fell out of the remembered set (reported without a probe), k10 was probed
    assert sorted(gone) == [0, 1, 2, 3, 4, 10]
    assert p.vanished(limit=20) == [] and p.stats().evictions == 6


def test_clear_names_this_clients_pages_and_close_makes_every_call_a_miss() -> None:
    store = FakeStore()
    p = pool(store)
    for i in range(3):
        p.put(f"k{i}", page(i), tag=100 + i)
    assert sorted(p.clear()) == [100, 101, 102] and store.objects == {}
    p.put("k", page(1), tag=1)
    p.close()
    p.close()  # idempotent
    assert store.closed == 1
    assert read(p, "k") is None and not p.exists("k") and not p.put("j", page(2)).stored
    assert p.vanished(10) == []


def region(p: MooncakePagePool, n: int) -> list[list[np.ndarray]]:
    """``n`` pages' chunks inside one array registered with ``p`` (SGLang's host pool)."""
    mem = np.zeros(n * PAGE, np.uint8)
    p.register_memory(mem)
    return [list(np.split(mem[i * PAGE:(i + 1) * PAGE], 4)) for i in range(n)]


def test_zero_copy_batches_move_in_one_call_and_keep_the_put_semantics() -> None:
    store = FakeStore()
    p = pool(store, zero_copy_min_chunk=0)  # every chunk in registered memory goes zero-copy
    src = region(p, 4)
    for i, chunks in enumerate(src):
        for dst, part in zip(chunks, page(i), strict=True):
            dst[:] = part
    p.put("k0", page(0), tag=0)  # already there: not written again
    results = p.put_many([PageIO(f"k{i}", src[i], i) for i in range(4)])
    assert [r.new for r in results] == [False, True, True, True] and all(r.stored for r in results)
    assert store.multi_buffer_calls == 1
    dst = region(p, 5)
    order = [3, 1, 0, 2]
    got = p.get_many([PageIO(f"k{i}", dst[slot]) for slot, i in enumerate(order)]
                     + [PageIO("nope", dst[4])])
    assert got == [True, True, True, True, False] and store.multi_buffer_calls == 2
    for slot, i in enumerate(order):
        assert (np.concatenate(dst[slot]) == np.concatenate(page(i))).all()
    # the object is bytes then checksum, whichever path wrote it: a packed read finds it
    assert (read(p, "k2") == np.concatenate(page(2))).all()


def test_small_chunks_are_packed_in_one_call_and_a_bad_page_fails_alone() -> None:
    store = FakeStore()
    p = pool(store)  # 1 KiB chunks: packed, registered memory or not
    results = p.put_many([PageIO(f"k{i}", page(i), i) for i in range(3)])  # private arrays
    assert all(r.new for r in results) and store.batch_calls == 1
    bad = bytearray(store.objects["k1"])
    bad[3] ^= 0x01
    store.objects["k1"] = bytes(bad)
    dst = region(p, 3)
    assert p.get_many([PageIO(f"k{i}", dst[i]) for i in range(3)]) == [True, False, True]
    assert "k1" not in store.objects and p.stats().checksum_failures == 1
    assert not any(c.any() for c in dst[1])  # the bad page's bytes never reached the caller
    assert store.batch_calls == 2 and store.multi_buffer_calls == 0


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_call_carries_a_bounded_number_of_transfers(zero_copy: bool) -> None:
    store = FakeStore()
    p = pool(store, zero_copy_min_chunk=0 if zero_copy else ZERO_COPY_MIN_CHUNK)
    n = 300
    src = region(p, n)
    assert all(r.stored for r in p.put_many([PageIO(f"k{i}", src[i], i) for i in range(n)]))
    per_page = 5 if zero_copy else 1  # 4 chunks and a checksum slot, or one packed slot
    calls = -(-n * per_page // (BATCH_BUFFERS // per_page * per_page))
    assert store.batch_calls == calls and store.multi_buffer_calls == (calls if zero_copy else 0)


def test_close_unregisters_every_buffer() -> None:
    store = FakeStore()
    p = pool(store)
    region(p, 2)
    assert len(store.regions) == 3  # staging, checksum slots, the caller's memory
    p.close()
    assert store.regions == {}
    assert p.get_many([PageIO("k", page(0))]) == [False]


def test_the_resync_probes_pages_in_demand_before_the_round_robin() -> None:
    store = FakeStore()
    p = pool(store)
    for i in range(6):
        p.put(f"k{i}", page(i), tag=i)
    read(p, "k5")
    del store.objects["k5"]  # evicted after it was read: a fetch the router would plan
    assert p.vanished(limit=1) == [5]  # round-robin alone would have probed k0
    del store.objects["k0"]
    assert p.vanished(limit=1) == [0]


def test_copy_here_copies_onto_this_clients_segment_and_remembers_the_copies() -> None:
    """docs/interfaces.md, "Where hosts are": one copy task per page, onto this client's own
    segment, waited for; a page the store does not have is not copied; the copies of the
    leading run (what the backend publishes) are probed by the resync like the pages this
    client wrote, a copy past the gap is not."""
    store = FakeStore({"k1": b"x", "k2": b"y", "k3": b"z"})
    p = pool(store)
    assert p.copy_here(["k1", "k2", "gone", "k3"], [1, 2, 3, 4]) == [True, True, False, True]
    assert store.copies == [(k, ["10.0.0.2:15000"]) for k in ("k1", "k2", "k3")]
    del store.objects["k2"], store.objects["k3"]  # evicted: only k2 was published, and is told
    assert [tag for _ in range(8) for tag in p.vanished(limit=10)] == [2]
    store.pending_polls = 10**9  # never done: taken as failed after the timeout
    assert p.copy_here(["k1"], [1], timeout_s=0.1) == [False]
    p.close()
    assert p.copy_here(["k1"], [1]) == [False]  # closed: nothing is asked of the store
