"""MooncakePagePool's own logic against a fake client (the real store: test_mooncake_pool.py):
error codes, the checksum, the written-page bookkeeping, clear and close."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from sglang_patch.pool.base import PoolError
from sglang_patch.pool.mooncake_pool import MIN_SEGMENT_BYTES, MooncakePagePool

PAGE = 4096


class FakeStore:
    """The calls MooncakePagePool makes, with Mooncake's semantics: a put of an existing key
    keeps the old bytes, errors are negative ints, a missing key's get is an error."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.fail_puts = False
        self.closed = 0

    def setup(self, *args: object) -> int:
        return 0

    def get_hostname(self) -> str:
        return "10.0.0.2:15000"

    def register_buffer(self, ptr: int, size: int) -> int:
        return 0

    def unregister_buffer(self, ptr: int) -> int:
        return 0

    def is_exist(self, key: str) -> int:
        return int(key in self.objects)

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return [self.is_exist(k) for k in keys]

    def put_from(self, key: str, ptr: int, size: int, config: object) -> int:
        if self.fail_puts:
            return -200  # no space
        self.objects.setdefault(key, ctypes.string_at(ptr, size))
        return 0

    def get_into(self, key: str, ptr: int, size: int) -> int:
        data = self.objects.get(key)
        if data is None:
            return -704  # object not found
        if len(data) > size:
            return -600
        ctypes.memmove(ptr, data, len(data))
        return len(data)

    def remove(self, key: str, force: bool = False) -> int:
        return 0 if self.objects.pop(key, None) is not None else -704

    def remove_all(self, force: bool = False) -> int:
        n = len(self.objects)
        self.objects.clear()
        return n

    def close(self) -> int:
        self.closed += 1
        return 0


def pool(store: FakeStore, segment: int = MIN_SEGMENT_BYTES) -> MooncakePagePool:
    return MooncakePagePool("mooncake-m-1@10.0.0.2:1", PAGE, "m:1", "10.0.0.2", segment,
                            store_factory=lambda: store)


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
