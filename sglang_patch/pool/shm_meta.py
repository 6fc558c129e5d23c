"""The shared metadata of a shared-memory pool: slot table + open-addressing key index.

One file ``meta`` under the pool's directory, memory-mapped by every process, holds:

- a header of uint64 words: the geometry (magic, slot count, page size, slots per segment, table
  size, layout version) and an xxh3 checksum of it, then counters (tick clock for LRU, page count,
  tombstones, statistics, resets, reclaimed writes),
- one record per slot (key digest, tag, generation, length, checksum, last use, state, and while
  WRITING the writer's identity and start of write: ``liveness.py``),
- a hash table ``key digest -> slot`` (int32; -1 empty, -2 tombstone), twice the slot count.

Nothing here locks: every method must be called while holding the pool's lock (``shm_pool.py``),
except reading a slot's ``gen``/``state`` after a copy, which is a single aligned load.

Nothing here trusts the file either (any process, or anyone with write access to ``/dev/shm``, can
damage it): every loop is bounded by the table size, every index read from the file is range
checked, and damage is raised as :class:`~sglang_patch.pool.base.PoolCorrupt`, never as an
``IndexError`` or a hang. Before touching the mapping, :meth:`SlotMeta.check` compares the file
size with the mapping: a file truncated under a mapping would otherwise kill the reader (SIGBUS).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
from typing import NamedTuple

import numpy as np
import xxhash

from sglang_patch.pool.base import CorruptReason, PoolCorrupt

MAGIC = 0x52475F504F4F4C31  # "RG_POOL1"
VERSION = 2  # 1 (no version word): 80-byte slots, no writer identity
EMPTY, TOMB = -1, -2
FREE, WRITING, VALID = 0, 1, 2
MASK64 = (1 << 64) - 1
SEG_TARGET_BYTES = 256 << 20

# header word indices
H_MAGIC, H_NSLOTS, H_PAGE_BYTES, H_SLOTS_PER_SEG, H_TABLE, H_TICK, H_COUNT, H_TOMBS = range(8)
H_STORES, H_HITS, H_MISSES, H_EVICTIONS, H_BAD_SUM, H_MID_READ = range(8, 14)
H_VERSION, H_GEOM_SUM, H_RESETS, H_RECLAIMED = range(14, 18)
HEADER_WORDS = 24  # 18-23 reserved

SLOT_DTYPE = np.dtype(
    [
        ("key", "u1", (32,)),
        ("tag", "<i8"),
        ("gen", "<u8"),
        ("length", "<u8"),
        ("checksum", "<u8"),
        ("last_used", "<u8"),
        ("state", "<u8"),
        ("writer", "<u8"),  # while WRITING: pid, start time, pid namespace of the writer
        ("writer_start", "<u8"),
        ("writer_ns", "<u8"),
        ("writing_since", "<u8"),  # time.monotonic_ns() when the write began (its lease)
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


class Geometry(NamedTuple):
    """The shape every process sharing a pool must agree on."""

    nslots: int
    page_bytes: int
    per_seg: int

    @classmethod
    def for_capacity(cls, page_bytes: int, capacity_bytes: int) -> Geometry:
        nslots = capacity_bytes // page_bytes
        return cls(nslots, page_bytes, max(1, min(nslots, SEG_TARGET_BYTES // page_bytes)))

    @property
    def nsegments(self) -> int:
        return -(-self.nslots // self.per_seg)

    def words(self) -> np.ndarray:
        """The header words ``H_MAGIC..H_TABLE``, then ``H_VERSION`` and ``H_GEOM_SUM``."""
        words = [MAGIC, self.nslots, self.page_bytes, self.per_seg, table_size_for(self.nslots),
                 VERSION]
        raw = np.array(words, dtype="<u8")
        return np.append(raw, np.uint64(xxhash.xxh3_64_intdigest(raw.tobytes())))

    def plausible(self) -> bool:
        return (self.nslots >= 1 and self.page_bytes >= 1
                and self == Geometry.for_capacity(self.page_bytes, self.nslots * self.page_bytes))


def geometry_words(header: np.ndarray) -> np.ndarray:
    return np.concatenate([header[H_MAGIC : H_TABLE + 1], header[H_VERSION : H_GEOM_SUM + 1]])


class SlotMeta:
    """Typed numpy views over the mapped ``meta`` file of geometry ``geom``."""

    def __init__(self, path: str, geom: Geometry) -> None:
        self.geom = geom
        self.nslots = geom.nslots
        self.size = meta_bytes(geom.nslots)
        self._expected = geom.words()
        self._expected_head = self._expected[: H_TABLE + 1].tobytes()
        self._expected_tail = self._expected[H_TABLE + 1 :].tobytes()
        self._fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(self._fd).st_size < self.size:
                os.ftruncate(self._fd, self.size)  # callers hold the lock and format it next
            self._map = mmap.mmap(self._fd, self.size)
        except BaseException:
            os.close(self._fd)
            raise
        buf = np.frombuffer(self._map, dtype=np.uint8)
        end_slots = HEADER_WORDS * 8 + geom.nslots * SLOT_DTYPE.itemsize
        self.header = buf[: HEADER_WORDS * 8].view("<u8")
        self.slots = buf[HEADER_WORDS * 8 : end_slots].view(SLOT_DTYPE)
        self.table = buf[end_slots:].view("<i4")

    @staticmethod
    def create(path: str, geom: Geometry) -> None:
        """Write a fresh meta file (caller holds the pool lock and checked it is absent)."""
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as fh:
            fh.truncate(meta_bytes(geom.nslots))
        meta = SlotMeta(tmp, geom)
        meta.format()
        meta.close()
        os.replace(tmp, path)

    def grow(self) -> None:
        """Give a truncated meta file its mapped size back (zeros; format() follows)."""
        if os.fstat(self._fd).st_size < self.size:
            os.ftruncate(self._fd, self.size)

    def inode(self) -> int:
        return os.fstat(self._fd).st_ino

    def close(self) -> None:
        del self.header, self.slots, self.table
        with contextlib.suppress(BufferError):  # a view is still alive; the OS unmaps at exit
            self._map.close()
        os.close(self._fd)

    # --- validation and reset ------------------------------------------------------------------

    def check(self) -> None:
        """The cheap check run on every lock: file size and geometry words. Raises PoolCorrupt."""
        size = os.fstat(self._fd).st_size
        if size < self.size:  # checked first: reading the header of a short file is a SIGBUS
            raise PoolCorrupt(CorruptReason.SHORT_FILE, f"meta is {size} bytes, mapped {self.size}")
        # plain bytes compares: this runs on every lock, numpy calls cost microseconds each
        if (self._map[: H_TABLE * 8 + 8] != self._expected_head
                or self._map[H_VERSION * 8 : H_GEOM_SUM * 8 + 8] != self._expected_tail):
            raise PoolCorrupt(CorruptReason.BAD_HEADER, "geometry words changed under the mapping")

    def validate(self) -> None:
        """:meth:`check` plus every table entry and slot record. Raises PoolCorrupt."""
        self.check()
        table = self.table
        if int(table.min()) < TOMB or int(table.max()) >= self.nslots:
            raise PoolCorrupt(CorruptReason.BAD_TABLE, "key index entry out of range")
        if not (table < 0).any():
            raise PoolCorrupt(CorruptReason.BAD_TABLE, "key index has no free position")
        if int(self.slots["state"].max()) > VALID:
            raise PoolCorrupt(CorruptReason.BAD_SLOT, "slot state out of range")
        valid = self.slots["state"] == VALID
        if (self.slots["length"][valid] > self.geom.page_bytes).any():
            raise PoolCorrupt(CorruptReason.BAD_SLOT, "stored length above page size")

    def format(self, count_reset: bool = False) -> list[tuple[str, int]]:
        """Empty the pool in place (the caller made the file its full size); returns the (key
        digest hex, tag) of the pages it held. Generations are bumped, not zeroed, so a reader
        copying a page outside the lock sees its page went away."""
        h = self.header
        h[H_MAGIC] = 0  # a process dying mid-format leaves a header the next opener rejects
        rec = self.slots
        valid = np.flatnonzero(rec["state"] == VALID)
        dropped = [(bytes(rec["key"][s]).hex(), int(rec["tag"][s])) for s in valid]
        rec["gen"] += np.uint64(1)  # uint64 arrays wrap silently: a damaged gen cannot overflow
        rec["state"] = FREE
        for field in SLOT_DTYPE.names or ():
            if field not in ("gen", "state"):
                rec[field] = 0
        self.table[:] = EMPTY
        h[H_TICK] = h[H_COUNT] = h[H_TOMBS] = 0
        if count_reset:
            self.bump(H_RESETS)
        words = self._expected
        h[H_NSLOTS : H_TABLE + 1] = words[H_NSLOTS : H_TABLE + 1]
        h[H_VERSION], h[H_GEOM_SUM] = words[-2], words[-1]
        h[H_MAGIC] = MAGIC  # last: a reader that sees the magic sees a complete file
        return dropped

    # --- counters -----------------------------------------------------------------------------

    def tick(self) -> int:
        self.header[H_TICK] = (int(self.header[H_TICK]) + 1) & MASK64
        return int(self.header[H_TICK])

    def bump(self, word: int, by: int = 1) -> None:
        """Counters never fail: a damaged one wraps or stops at 0 instead of raising."""
        self.header[word] = max(0, int(self.header[word]) + by) & MASK64

    def bump_gen(self, slot: int) -> int:
        gen = (int(self.slots["gen"][slot]) + 1) & MASK64
        self.slots["gen"][slot] = gen
        return gen

    # --- hash table -------------------------------------------------------------------------

    def _probe_start(self, digest: np.ndarray) -> int:
        return int.from_bytes(digest[:8].tobytes(), "little") & (len(self.table) - 1)

    def _entry(self, pos: int) -> int:
        entry = int(self.table[pos])
        if not TOMB <= entry < self.nslots:
            raise PoolCorrupt(CorruptReason.BAD_TABLE, f"key index entry {entry} at {pos}")
        return entry

    def find(self, digest: np.ndarray) -> int:
        """Slot holding ``digest`` (VALID or not), or -1."""
        mask = len(self.table) - 1
        pos = self._probe_start(digest)
        for _ in range(len(self.table)):
            entry = self._entry(pos)
            if entry == EMPTY:
                return -1
            if entry >= 0 and np.array_equal(self.slots["key"][entry], digest):
                return entry
            pos = (pos + 1) & mask
        return -1

    def insert(self, digest: np.ndarray, slot: int) -> None:
        mask = len(self.table) - 1
        pos = self._probe_start(digest)
        for _ in range(len(self.table)):  # bounded: a damaged table may have no free position
            entry = self._entry(pos)
            if entry < 0:
                if entry == TOMB:
                    self.bump(H_TOMBS, -1)
                self.table[pos] = slot
                return
            pos = (pos + 1) & mask
        raise PoolCorrupt(CorruptReason.BAD_TABLE, "key index has no free position")

    def delete(self, digest: np.ndarray, slot: int) -> None:
        mask = len(self.table) - 1
        pos = self._probe_start(digest)
        for _ in range(len(self.table)):
            entry = self._entry(pos)
            if entry == EMPTY:
                return
            if entry == slot:
                self.table[pos] = TOMB
                self.bump(H_TOMBS)
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
