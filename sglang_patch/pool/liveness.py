"""Whether the writer of a half-written pool slot can still finish it: process liveness + lease.

A ``put`` marks its slot WRITING with the writer's identity (:class:`Writer`: pid, the process's
start time and its pid namespace) and the time the write began, copies the page outside the lock,
then commits. A writer killed in between leaves the slot WRITING for good; :func:`stale_reason`
says when another process may take it back:

- the writer is provably gone: no ``/proc/<pid>``, a zombie, or a process with that pid but
  another start time (pid reuse cannot keep a slot stuck, nor make a dead writer look alive);
- or its lease expired (``lease_ns`` since the write began): the only rule for writers whose
  liveness cannot be checked (another pid namespace, no ``/proc``), and a bound for live ones
  that stopped (SIGSTOP, a debugger).

Taking a slot back from a writer that is in fact still copying is safe: the pool bumps the slot's
generation when it takes it, and a writer commits only if the generation is still the one it set
(``shm_pool.py``); a page whose bytes the two writers mixed fails its checksum on read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from sglang_patch.pool import shm_meta as m
from sglang_patch.pool.base import CorruptReason, PoolCorrupt

WRITE_LEASE_S = 60.0  # a page write takes milliseconds; this only bounds a stopped writer
SWEEP_INTERVAL_S = 0.5  # how often each process looks for stale writers (see the sweeper)
_PID_MAX = 1 << 22  # the kernel's hard limit (PID_MAX_LIMIT): a larger pid is garbage
log = logging.getLogger(__name__)


class Writer(NamedTuple):
    pid: int
    start: int  # /proc/<pid>/stat field 22 (clock ticks since boot); 0 = unknown
    ns: int  # inode of /proc/<pid>/ns/pid; 0 = unknown


class StaleReason(StrEnum):
    WRITER_DEAD = "writer_dead"  # no such process, a zombie, or the pid now names another one
    LEASE_EXPIRED = "lease_expired"  # liveness unknown or writer stopped: the write took too long


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (field 3 = state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # the command name is in parentheses and may itself contain ") ": split at the last one
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


def _pid_ns(pid: int | str) -> int:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return 0


_current: tuple[int, Writer] | None = None


def current_writer() -> Writer:
    """This process's identity (recomputed after a fork: the child is another writer)."""
    global _current
    pid = os.getpid()
    if _current is None or _current[0] != pid:
        fields = _stat_fields(pid)
        start = 0
        if fields is not None and len(fields) > 19:
            with contextlib.suppress(ValueError):
                start = int(fields[19])
        _current = (pid, Writer(pid, start, _pid_ns("self")))
    return _current[1]


def writer_dead(writer: Writer) -> bool | None:
    """True: provably gone; False: alive; None: cannot tell from here (another pid namespace,
    or no ``/proc``)."""
    me = current_writer()
    if me.ns == 0 or me.start == 0 or writer.ns != me.ns:
        return None
    if not 0 < writer.pid < _PID_MAX:
        return True
    fields = _stat_fields(writer.pid)
    if fields is None or len(fields) <= 19:
        return True
    return fields[0] in ("Z", "X") or fields[19] != str(writer.start)


def stale_reason(writer: Writer, since_ns: int, now_ns: int, lease_ns: int) -> StaleReason | None:
    """Why a slot WRITING since ``since_ns`` (``time.monotonic_ns``, the same clock in every
    process of the machine) by ``writer`` may be taken back now; None while it may not."""
    if writer_dead(writer):
        return StaleReason.WRITER_DEAD
    return StaleReason.LEASE_EXPIRED if lease_expired(since_ns, now_ns, lease_ns) else None


def lease_expired(since_ns: int, now_ns: int, lease_ns: int) -> bool:
    # a start in the future is garbage (damaged meta), not a young write
    return now_ns - since_ns > lease_ns or since_ns > now_ns + lease_ns


def now_ns() -> int:
    return time.monotonic_ns()


class StaleWriterSweeper:
    """Frees a pool's WRITING slots whose writer is dead or out of lease (caller holds the pool
    lock). :meth:`sweep_if_due` runs at most once per ``SWEEP_INTERVAL_S`` per process: a scan of
    every slot plus a ``/proc`` read per live writer on every ``put`` would cost more than
    copying a small page, and a dead writer's slot waiting that long costs nothing."""

    def __init__(self, pool_id: str, lease_s: float) -> None:
        self.pool_id = pool_id
        self.lease_ns = int(lease_s * 1e9)
        self._next_ns = 0

    def sweep_if_due(self, meta: m.SlotMeta) -> int:
        now = now_ns()
        if now < self._next_ns:
            return 0
        self._next_ns = now + int(SWEEP_INTERVAL_S * 1e9)
        return self.sweep(meta)

    def sweep(self, meta: m.SlotMeta) -> int:
        """How many slots it freed (each counted in the header's ``H_RECLAIMED``). Raises
        PoolCorrupt for a slot in no known state: nothing would ever free it."""
        rec, now, freed = meta.slots, now_ns(), 0
        state = rec["state"]
        if int(state.max()) > m.VALID:
            raise PoolCorrupt(CorruptReason.BAD_SLOT, "slot state out of range")
        for slot in np.flatnonzero(state == m.WRITING):
            writer = Writer(int(rec["writer"][slot]), int(rec["writer_start"][slot]),
                            int(rec["writer_ns"][slot]))
            reason = stale_reason(writer, int(rec["writing_since"][slot]), now, self.lease_ns)
            if reason is None:
                continue
            meta.bump_gen(int(slot))  # the writer, if it still runs, will not commit
            rec["state"][slot] = m.FREE
            meta.bump(m.H_RECLAIMED)
            freed += 1
            log.info("pool %s: slot %d taken back from writer pid %d (%s)", self.pool_id, slot,
                     writer.pid, reason.value)
        return freed
