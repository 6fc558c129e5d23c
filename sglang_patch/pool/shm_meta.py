"""The shared metadata of a shared-memory pool: slot table + open-addressing key index.

One file ``meta`` under the pool's directory, memory-mapped by every process, holds:

- a header of uint64 counters (tick clock for LRU, page count, tombstones, statistics),
- one record per slot (key digest, tag, generation, length, checksum, last use, state),
- a hash table ``key digest -> slot`` (int32; -1 empty, -2 tombstone), twice the slot count.

Nothing here locks: every method must be called while holding the pool's lock (``shm_pool.py``),
except reading a slot's ``gen``/``state`` after a copy, which is a single aligned load.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os

import numpy as np

MAGIC = 0x52475F504F4F4C31  # "RG_POOL1"
EMPTY, TOMB = -1, -2
FREE, WRITING, VALID = 0, 1, 2

# header word indices
H_MAGIC, H_NSLOTS, H_PAGE_BYTES, H_SLOTS_PER_SEG, H_TABLE, H_TICK, H_COUNT, H_TOMBS = range(8)
H_STORES, H_HITS, H_MISSES, H_EVICTIONS, H_BAD_SUM, H_MID_READ = range(8, 14)
HEADER_WORDS = 16

SLOT_DTYPE = np.dtype(
    [
        ("key", "u1", (32,)),
        ("tag", "<i8"),
        ("gen", "<u8"),
        ("length", "<u8"),
        ("checksum", "<u8"),
        ("last_used", "<u8"),
        ("state", "<u8"),
    ]
)


def key_digest(key: str) -> np.ndarray:
    """32-byte digest of a pool key: collisions are cryptographically negligible."""
    return np.frombuffer(hashlib.blake2b(key.encode(), digest_size=32).digest(), dtype=np.uint8)


def table_size_for(nslots: int) -> int:
    size = 8
    while size < 2 * nslots:
        size *= 2
    return size


def meta_bytes(nslots: int) -> int:
    return HEADER_WORDS * 8 + nslots * SLOT_DTYPE.itemsize + table_size_for(nslots) * 4


class SlotMeta:
    """Typed numpy views over the mapped ``meta`` file."""

    def __init__(self, path: str, nslots: int) -> None:
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, meta_bytes(nslots))
        buf = np.frombuffer(self._map, dtype=np.uint8)
        end_slots = HEADER_WORDS * 8 + nslots * SLOT_DTYPE.itemsize
        self.header = buf[: HEADER_WORDS * 8].view("<u8")
        self.slots = buf[HEADER_WORDS * 8 : end_slots].view(SLOT_DTYPE)
        self.table = buf[end_slots:].view("<i4")
        self.nslots = nslots

    @staticmethod
    def create(path: str, nslots: int, page_bytes: int, slots_per_seg: int) -> None:
        """Write a fresh meta file (caller holds the pool lock and checked it is absent)."""
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as fh:
            fh.truncate(meta_bytes(nslots))
        meta = SlotMeta(tmp, nslots)
        meta.table[:] = EMPTY
        h = meta.header
        h[H_NSLOTS], h[H_PAGE_BYTES], h[H_SLOTS_PER_SEG] = nslots, page_bytes, slots_per_seg
        h[H_TABLE] = len(meta.table)
        h[H_MAGIC] = MAGIC  # last: a reader that sees the magic sees a complete file
        meta.close()
        os.replace(tmp, path)

    @staticmethod
    def read_geometry(path: str) -> tuple[int, int, int]:
        """(nslots, page_bytes, slots_per_seg) of an existing meta file."""
        with open(path, "rb") as fh:
            words = np.frombuffer(fh.read(HEADER_WORDS * 8), dtype="<u8")
        if len(words) < HEADER_WORDS or int(words[H_MAGIC]) != MAGIC:
            raise ValueError(f"{path} is not a radix-global pool meta file")
        return int(words[H_NSLOTS]), int(words[H_PAGE_BYTES]), int(words[H_SLOTS_PER_SEG])

    def close(self) -> None:
        del self.header, self.slots, self.table
        with contextlib.suppress(BufferError):  # a view is still alive; the OS unmaps at exit
            self._map.close()
        os.close(self._fd)

    def tick(self) -> int:
        self.header[H_TICK] += 1
        return int(self.header[H_TICK])

    def bump(self, word: int, by: int = 1) -> None:
        self.header[word] = int(self.header[word]) + by

    # --- hash table -------------------------------------------------------------------------

    def _probe_start(self, digest: np.ndarray) -> int:
        return int.from_bytes(digest[:8].tobytes(), "little") & (len(self.table) - 1)

    def find(self, digest: np.ndarray) -> int:
        """Slot holding ``digest`` (VALID or not), or -1."""
        mask = len(self.table) - 1
        pos = self._probe_start(digest)
        for _ in range(len(self.table)):
            entry = int(self.table[pos])
            if entry == EMPTY:
                return -1
            if entry >= 0 and np.array_equal(self.slots["key"][entry], digest):
                return entry
            pos = (pos + 1) & mask
        return -1

    def insert(self, digest: np.ndarray, slot: int) -> None:
        mask = len(self.table) - 1
        pos = self._probe_start(digest)
        while int(self.table[pos]) >= 0:
            pos = (pos + 1) & mask
        if int(self.table[pos]) == TOMB:
            self.header[H_TOMBS] -= 1
        self.table[pos] = slot

    def delete(self, digest: np.ndarray, slot: int) -> None:
        mask = len(self.table) - 1
        pos = self._probe_start(digest)
        for _ in range(len(self.table)):
            entry = int(self.table[pos])
            if entry == EMPTY:
                return
            if entry == slot:
                self.table[pos] = TOMB
                self.header[H_TOMBS] += 1
                break
            pos = (pos + 1) & mask
        if int(self.header[H_TOMBS]) > len(self.table) // 4:
            self._rebuild(skip=slot)

    def _rebuild(self, skip: int) -> None:
        """Drop tombstones: long probe chains would otherwise grow without bound. ``skip`` is the
        slot being deleted (its state is still VALID while its caller finishes freeing it)."""
        self.table[:] = EMPTY
        self.header[H_TOMBS] = 0
        for slot in np.flatnonzero(self.slots["state"] == VALID):
            if int(slot) != skip:
                self.insert(self.slots["key"][slot], int(slot))

    # --- slot choice ------------------------------------------------------------------------

    def free_slot(self) -> int:
        free = np.flatnonzero(self.slots["state"] == FREE)
        return int(free[0]) if len(free) else -1

    def lru_slot(self) -> int:
        """Least recently used VALID slot, or -1 (all slots are being written)."""
        valid = self.slots["state"] == VALID
        if not valid.any():
            return -1
        last = np.where(valid, self.slots["last_used"], np.iinfo(np.uint64).max)
        return int(np.argmin(last))
