"""The shm pool survives its own processes (issue 12, items 12 and 13): writers killed mid-write,
and a damaged ``meta`` file or segment (bad header, index, slots, files truncated while mapped).

Every damage is done from outside, through the files, as another process or a stray write would.
Operations that could hang or die of a signal run in a forked child with a time bound
(``pool_fault_tools.in_child``), so a regression fails the test instead of freezing pytest.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import uuid

import numpy as np
import pytest
from pool_fault_tools import MetaViews, in_child, page

from sglang_patch.pool import shm_meta as m
from sglang_patch.pool.shm_pool import ShmPagePool, destroy_pool

PAGE = 4096
CAP = 4


@pytest.fixture
def pool_id():
    pid = f"test-{uuid.uuid4().hex[:10]}"
    yield pid
    destroy_pool(pid)


def _filled(pool_id: str, n: int = CAP, cap: int = CAP) -> ShmPagePool:
    pool = ShmPagePool(pool_id, PAGE, cap * PAGE)
    for i in range(n):
        assert pool.put(f"old{i}", [page(i, PAGE)], tag=i).new
    return pool


def _works(pool: ShmPagePool, key: str = "after", seed: int = 99) -> bool:
    """A valid put then get returns exactly the bytes put."""
    out = np.zeros(PAGE, np.uint8)
    return (pool.put(key, [page(seed, PAGE)]).stored and pool.get_into(key, [out])
            and np.array_equal(out, page(seed, PAGE)))


# --- item 12: writers killed mid-write ---------------------------------------------------------


def _die_mid_write(pool_id: str, k: int, ready) -> None:
    pool = ShmPagePool(pool_id, PAGE, CAP * PAGE)

    def half_then_hang(dst, arrays):  # half the page written, then the writer is killed
        dst[: len(dst) // 2] = b"\xee" * (len(dst) // 2)
        ready.set()
        time.sleep(60)

    ShmPagePool._copy_in = staticmethod(half_then_hang)  # type: ignore[method-assign]
    pool.put(f"dying{k}", [page(1000 + k, PAGE)])


def test_slots_of_killed_writers_are_reclaimed(pool_id):
    """Before: slots of killed writers came back only when no other slot was free or valid, so
    after CAP kills the pool held one page at a time (each put evicted the one before)."""
    from sglang_patch.pool import liveness as lv

    pool = _filled(pool_id)
    ctx = mp.get_context("fork")
    for k in range(CAP + 2):
        ready = ctx.Event()
        proc = ctx.Process(target=_die_mid_write, args=(pool_id, k, ready))
        proc.start()
        assert ready.wait(10), "writer never reached the middle of its write"
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
    time.sleep(lv.SWEEP_INTERVAL_S)  # this process looks for dead writers this often
    for i in range(CAP):
        assert pool.put(f"new{i}", [page(100 + i, PAGE)], tag=i).new
    assert pool.stats().pages == CAP
    for i in range(CAP):
        out = np.zeros(PAGE, np.uint8)
        assert pool.get_into(f"new{i}", [out]) and np.array_equal(out, page(100 + i, PAGE))
    assert pool.stats().reclaimed_writes >= 1


def test_liveness_is_pid_and_start_time_and_lease_bounds_the_rest(pool_id):
    """Half-written slots whose writer is: alive (kept), a reused pid (another start time:
    reclaimed), in another pid namespace (kept until its lease expires), or out of lease."""
    from sglang_patch.pool import liveness as lv

    pool = ShmPagePool(pool_id, PAGE, CAP * PAGE, write_lease_s=30)
    me, now = lv.current_writer(), lv.now_ns()
    old = now - 31 * 10**9
    cases = [  # slot: (writer, writing since, reclaimed?)
        (me, now, False),
        (me._replace(start=me.start + 1), now, True),  # pid reused by us: its writer is gone
        (me._replace(ns=me.ns + 1), now, False),  # unknown liveness, lease still running
        (me._replace(ns=me.ns + 1), old, True),  # unknown liveness, lease expired
    ]
    views = MetaViews(pool.dir, CAP)
    for slot, (writer, since, _) in enumerate(cases):
        rec = views.slots
        rec["state"][slot] = m.WRITING
        rec["writer"][slot], rec["writer_start"][slot], rec["writer_ns"][slot] = writer
        rec["writing_since"][slot] = since
    views.flush()
    assert pool.put("k", [page(1, PAGE)]).new  # allocation sweeps first
    state = MetaViews(pool.dir, CAP).slots["state"]
    kept = [slot for slot, case in enumerate(cases) if not case[2]]
    assert [int(state[s]) for s in kept] == [m.WRITING] * len(kept)
    assert pool.stats().reclaimed_writes == 2 and pool.stats().pages == 1


def test_a_zombie_or_reaped_writer_is_dead_a_live_one_is_not():
    """A killed worker whose parent has not reaped it yet is a zombie: still in /proc, same
    start time, but it will never finish its write."""
    from sglang_patch.pool import liveness as lv

    me = lv.current_writer()
    assert lv.writer_dead(me) is False
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + 10
    while (fields := lv._stat_fields(pid)) is not None and fields[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    zombie = lv.Writer(pid, int(fields[19]) if fields else 0, me.ns)
    assert lv.writer_dead(zombie) is True
    os.waitpid(pid, 0)
    assert lv.writer_dead(zombie) is True
    assert lv.writer_dead(lv.Writer(0, 1, me.ns)) is True  # garbage pids are dead, never signalled
    assert lv.writer_dead(me._replace(ns=me.ns + 1)) is None  # another pid namespace: unknown


def test_writer_whose_slot_was_taken_back_never_commits(pool_id, monkeypatch):
    """A live but slow writer loses its slot at lease expiry; its late bytes must not become a
    wrong page for the key that now owns the slot (it commits only if its generation held)."""
    slow = ShmPagePool(pool_id, PAGE, 1 * PAGE, write_lease_s=0.05)
    other = ShmPagePool(pool_id, PAGE, 1 * PAGE, write_lease_s=0.05)
    real_copy = ShmPagePool._copy_in
    go, inside = threading.Event(), threading.Event()

    def stalled(dst, arrays):
        if threading.current_thread().name == "slow":
            inside.set()
            assert go.wait(10)
        real_copy(dst, arrays)

    monkeypatch.setattr(ShmPagePool, "_copy_in", staticmethod(stalled))
    result = []
    thread = threading.Thread(name="slow", target=lambda: result.append(
        slow.put("a", [page(1, PAGE)])))
    thread.start()
    assert inside.wait(10)
    time.sleep(0.1)
    assert other.put("b", [page(2, PAGE)]).new  # took the slot back from the slow writer
    go.set()
    thread.join(10)
    assert not result[0].stored
    out = np.zeros(PAGE, np.uint8)
    assert not other.get_into("a", [out])
    if other.get_into("b", [out]):  # the slow writer overwrote b's bytes: a miss, never a's
        assert np.array_equal(out, page(2, PAGE))


# --- item 13: damaged meta file and segments ---------------------------------------------------


def _puts_then_work(pool: ShmPagePool) -> tuple[list[bool], bool, int]:
    stored = [pool.put(f"fresh{i}", [page(i, PAGE)]).stored for i in range(CAP)]
    return stored, _works(pool), pool.stats().resets


def test_full_index_never_hangs_insert(pool_id):
    """Before: an index with no free position made insert spin forever holding the lock (every
    entry names the most recent slot, so lookups miss and the evicted slot has no entry)."""
    pool = _filled(pool_id)
    views = MetaViews(pool.dir, CAP)
    views.table[:] = CAP - 1
    views.flush()
    kind, value = in_child(_puts_then_work, pool, timeout=10)
    assert kind == "ok", value
    stored, works, resets = value
    assert not stored[0] and all(stored[1:])  # the put that found it is refused
    assert works and resets == 1


def _get(pool: ShmPagePool, key: str) -> bool:
    return pool.get_into(key, [np.zeros(PAGE, np.uint8)])


def test_out_of_range_index_entry_resets_the_pool(pool_id):
    """Before: IndexError out of get_into."""
    pool = _filled(pool_id)
    views = MetaViews(pool.dir, CAP)
    views.table[:] = 10**6
    views.flush()
    assert not _get(pool, "old0")
    assert pool.resets == 1 and pool.stats().resets == 1 and pool.stats().pages == 0
    assert _works(pool)


def test_slots_in_unknown_states_reset_the_pool(pool_id):
    """Before: every slot in a state that is neither free, writing nor valid: put refused for
    good (the pool's whole capacity lost)."""
    pool = _filled(pool_id)
    views = MetaViews(pool.dir, CAP)
    views.slots["state"][:] = 7
    views.flush()
    assert any(pool.put(f"k{i}", [page(i, PAGE)]).stored for i in range(3))
    assert pool.stats().resets == 1


def test_counter_underflow_is_no_error(pool_id):
    """Before: OverflowError (a page count of 0 decremented into a uint64)."""
    pool = _filled(pool_id, n=1)
    views = MetaViews(pool.dir, CAP)
    views.header[m.H_COUNT] = 0
    views.flush()
    assert pool.remove("old0") and pool.stats().pages == 0


@pytest.mark.parametrize(("word", "value"), [(m.H_SLOTS_PER_SEG, 0), (m.H_NSLOTS, 10**6),
                                             (m.H_MAGIC, 12345), (m.H_PAGE_BYTES, 2 * PAGE)])
def test_damaged_header_on_open_rebuilds_the_pool(pool_id, word, value):
    """Before: ZeroDivisionError (0 slots per segment), ValueError (slot count beyond the file,
    bad magic), PoolError 'exists with page_bytes' (a flipped page size looked like a real
    geometry mismatch) out of the constructor."""
    _filled(pool_id)
    views = MetaViews(os.path.join("/dev/shm/radix-global", pool_id), CAP)
    views.header[word] = value
    views.flush()
    kind, value = in_child(lambda: (lambda p: (p.capacity_pages, p.exists("old0"), _works(p)))(
        ShmPagePool(pool_id, PAGE, 2 * CAP * PAGE)))
    # the slot count comes back from the file size: the processes mapping it keep working
    assert (kind, value) == ("ok", (CAP, False, True))
    from sglang_patch.pool.base import PoolError

    views = MetaViews(os.path.join("/dev/shm/radix-global", pool_id), CAP)
    views.header[m.H_MAGIC] = 0
    views.flush()
    with pytest.raises(PoolError, match="damaged"):
        ShmPagePool.open_existing(pool_id)


def _exists_then_work(pool: ShmPagePool) -> tuple[bool, bool]:
    return pool.exists("old1"), _works(pool)


def test_meta_truncated_while_mapped_is_no_sigbus_in_any_process(pool_id):
    """Before: the reader died of SIGBUS. Now the first process to look grows the file back and
    resets; another that had it mapped the whole time sees the emptied pool, no signal."""
    pool = _filled(pool_id)
    os.truncate(os.path.join(pool.dir, "meta"), 100)
    assert in_child(_get, pool, "old0") == ("ok", False)
    assert in_child(_exists_then_work, pool) == ("ok", (False, True))
    assert pool.stats().resets == 1 and _works(pool, "again", 5)


def test_segment_truncated_while_mapped_is_no_sigbus(pool_id):
    pool = _filled(pool_id)
    os.truncate(os.path.join(pool.dir, "seg-0"), 0)
    assert in_child(_get, pool, "old0") == ("ok", False)
    assert pool.stats().resets == 1
    assert in_child(_works, pool) == ("ok", True)


def test_pool_rebuilt_with_another_geometry_is_followed_not_reset_back(pool_id):
    """Header and size both destroyed: a new process rebuilds the pool at its own capacity; a
    process that had the old one mapped attaches to the new geometry (no reset ping-pong)."""
    first = _filled(pool_id)
    meta_path = os.path.join(first.dir, "meta")
    os.truncate(meta_path, 10)
    second = ShmPagePool(pool_id, PAGE, 2 * CAP * PAGE)
    assert second.capacity_pages == 2 * CAP
    assert in_child(_exists_then_work, first) == ("ok", (False, True))
    assert not first.exists("old1")  # the operation that finds the new geometry is a miss
    assert _works(first) and first.capacity_pages == 2 * CAP
    assert second.exists("after") and _works(second, "second", 3) and first.exists("second")
    assert second.stats().resets == 1
