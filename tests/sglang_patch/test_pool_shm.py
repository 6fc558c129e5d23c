"""Unit tests of the shared-memory page pool (no SGLang): contract of sglang_patch/pool/base.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import uuid

import numpy as np
import pytest

from sglang_patch.pool.shm_pool import NO_VERIFY_ENV, ShmPagePool, destroy_pool

PAGE = 4096


@pytest.fixture
def pool_id():
    pid = f"test-{uuid.uuid4().hex[:10]}"
    yield pid
    destroy_pool(pid)


def page(seed: int, size: int = PAGE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def test_put_get_roundtrip_scatter_gather(pool_id):
    pool = ShmPagePool(pool_id, PAGE, 16 * PAGE)
    data = page(1)
    assert pool.put("ns@1/a", [data[:1000], data[1000:]], tag=7).new
    out1, out2 = np.zeros(3000, np.uint8), np.zeros(PAGE - 3000, np.uint8)
    assert pool.get_into("ns@1/a", [out1, out2])
    assert np.array_equal(np.concatenate([out1, out2]), data)
    again = pool.put("ns@1/a", [data])
    assert again.stored and not again.new
    assert pool.stats().pages == 1 and pool.stats().hits == 1


def test_miss_wrong_length_and_oversize(pool_id):
    pool = ShmPagePool(pool_id, PAGE, 4 * PAGE)
    assert not pool.get_into("ns@1/none", [np.zeros(PAGE, np.uint8)])
    pool.put("k", [page(2)])
    assert not pool.get_into("k", [np.zeros(PAGE - 1, np.uint8)])
    assert not pool.put("big", [np.zeros(PAGE + 1, np.uint8)]).stored


def test_namespaces_are_separate_keys(pool_id):
    pool = ShmPagePool(pool_id, PAGE, 4 * PAGE)
    pool.put("model-a@1/abcd", [page(3)])
    assert pool.exists("model-a@1/abcd")
    assert not pool.exists("model-b@1/abcd")
    assert not pool.get_into("model-b@1/abcd", [np.zeros(PAGE, np.uint8)])


def test_clear_drops_every_page_and_returns_their_tags(pool_id):
    pool = ShmPagePool(pool_id, PAGE, 4 * PAGE)
    pool.put("a@1/k1", [page(1)], tag=11)
    pool.put("b@1/k2", [page(2)], tag=-5)  # tags are stored as int64: negatives round-trip
    assert sorted(pool.clear()) == [-5, 11]
    assert not pool.exists("a@1/k1") and pool.stats().pages == 0
    assert pool.clear() == []
    assert pool.put("a@1/k1", [page(1)], tag=11).new  # slots are reusable


def test_capacity_bound_and_lru_eviction(pool_id):
    pool = ShmPagePool(pool_id, PAGE, 3 * PAGE)
    for i in range(3):
        pool.put(f"k{i}", [page(i)], tag=100 + i)
    assert pool.get_into("k0", [np.zeros(PAGE, np.uint8)])  # k0 is now most recent
    res = pool.put("k3", [page(3)], tag=103)
    assert res.new and [e.tag for e in res.evicted] == [101]  # k1 was least recently used
    assert pool.exists("k0") and not pool.exists("k1") and pool.exists("k3")
    assert pool.stats().pages == 3 and pool.stats().evictions == 1
    for i in range(4, 40):  # churn: tombstones must not break lookups
        pool.put(f"k{i}", [page(i)])
    assert pool.stats().pages == 3
    out = np.zeros(PAGE, np.uint8)
    assert pool.get_into("k39", [out]) and np.array_equal(out, page(39))


def test_corrupted_page_is_a_miss_and_dropped(pool_id):
    pool = ShmPagePool(pool_id, PAGE, 4 * PAGE)
    pool.put("k", [page(5)])
    path, offset, _ = pool.locate("k")
    with open(path, "r+b") as fh:
        fh.seek(offset + 10)
        fh.write(b"\xff\x00\xff")
    assert not pool.get_into("k", [np.zeros(PAGE, np.uint8)])
    assert pool.stats().checksum_failures == 1 and not pool.exists("k")


def test_no_verify_switch_serves_corrupt_bytes(pool_id, monkeypatch):
    """Negative control for the checksum: with verification off the corruption gets through."""
    monkeypatch.setenv(NO_VERIFY_ENV, "1")
    pool = ShmPagePool(pool_id, PAGE, 4 * PAGE)
    pool.put("k", [page(5)])
    path, offset, _ = pool.locate("k")
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\x01\x02\x03")
    out = np.zeros(PAGE, np.uint8)
    assert pool.get_into("k", [out]) and not np.array_equal(out, page(5))


def test_eviction_mid_read_is_a_miss(pool_id, monkeypatch):
    pool = ShmPagePool(pool_id, PAGE, 1 * PAGE)
    pool.put("old", [page(6)])
    other = ShmPagePool(pool_id, PAGE, 1 * PAGE)
    real_copy = ShmPagePool._copy_out

    def copy_then_evict(src, views):  # another process evicts and rewrites the slot mid-copy
        real_copy(src, views)
        other.put("new", [page(7)])

    monkeypatch.setattr(ShmPagePool, "_copy_out", staticmethod(copy_then_evict))
    assert not pool.get_into("old", [np.zeros(PAGE, np.uint8)])
    monkeypatch.setattr(ShmPagePool, "_copy_out", staticmethod(real_copy))
    assert pool.stats().evicted_mid_read == 1
    out = np.zeros(PAGE, np.uint8)
    assert pool.get_into("new", [out]) and np.array_equal(out, page(7))


def test_geometry_mismatch_is_refused(pool_id):
    ShmPagePool(pool_id, PAGE, 4 * PAGE)
    from sglang_patch.pool.base import PoolError

    with pytest.raises(PoolError, match="page_bytes"):
        ShmPagePool(pool_id, 2 * PAGE, 4 * PAGE)


def _writer_reader(pool_id: str, wid: int, n: int, q) -> None:
    pool = ShmPagePool(pool_id, PAGE, 32 * PAGE)
    bad = good = 0
    for i in range(n):
        pool.put(f"w{wid}-{i}", [page(wid * 100000 + i)], tag=i)
        j = (i * 7) % (i + 1)
        for src in (0, 1):
            out = np.zeros(PAGE, np.uint8)
            if pool.get_into(f"w{src}-{j}", [out]):
                good += 1
                if not np.array_equal(out, page(src * 100000 + j)):
                    bad += 1
    q.put((wid, good, bad, os.getpid()))


def test_two_processes_concurrently_never_see_wrong_bytes(pool_id):
    """Two processes write and read overlapping keys in a pool smaller than what they write
    (constant eviction): every hit must return exactly the bytes stored under that key."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer_reader, args=(pool_id, w, 150, q)) for w in (0, 1)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert all(bad == 0 for _, _, bad, _ in results)
    assert sum(good for _, good, _, _ in results) > 50  # cross-process hits happened
    stats = ShmPagePool(pool_id, PAGE, 32 * PAGE).stats()
    assert stats.pages == 32 and stats.evictions == 300 - 32


def test_open_existing_takes_the_creators_geometry(pool_id):
    first = ShmPagePool(pool_id, PAGE, 8 * PAGE)
    first.put("k", [page(9)])
    other = ShmPagePool.open_existing(pool_id)
    assert other.page_bytes == PAGE and other.capacity_pages == 8 and other.exists("k")
    assert len(other.valid_keys_locations()) == 1


def test_corrupted_scattered_read_leaves_destination_untouched(pool_id):
    pool = ShmPagePool(pool_id, PAGE, 4 * PAGE)
    pool.put("k", [page(11)])
    path, offset, _ = pool.locate("k")
    with open(path, "r+b") as fh:
        fh.seek(offset + PAGE - 1)
        fh.write(b"\x00" if page(11)[-1] else b"\x01")
    parts = [np.zeros(PAGE // 2, np.uint8), np.zeros(PAGE // 2, np.uint8)]
    assert not pool.get_into("k", parts)
    assert not parts[0].any() and not parts[1].any()  # staged: nothing unverified delivered
