"""Remove the POSIX semaphore files an engine left in ``/dev/shm`` (issue 35, item 14).

Python's ``multiprocessing`` names its semaphores ``/dev/shm/sem.mp-<random>`` and leaves their
unlinking to its resource tracker, which a harness's SIGKILL of the process group ends first:
every SGLang engine run left a few behind, and the slot files of SGLang's load snapshots
(``/dev/shm/sglang_loads_*.shm``) likewise. The names carry no pid, so a harness snapshots the
names before it starts its engines (:func:`semaphores`) and, once it has stopped them,
:func:`sweep_semaphores` removes the new ones, never one that a live process still maps (an
engine of another session on this machine) nor one another user owns.

    before = semaphores()
    proc = subprocess.Popen(..., start_new_session=True)
    ...
    stop(proc)
    sweep_semaphores(before, groups=[proc.pid])
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Collection, Iterable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
# multiprocessing's semaphores, and the slot files of SGLang's load snapshots
# (sglang/srt/managers/load_snapshot.py), which a killed engine leaves too
PATTERNS = ("sem.mp-*", "sglang_loads_*.shm")
GROUP_WAIT_S = 10.0  # how long the sweep waits for the stopped groups' processes to be gone


def semaphores(shm_dir: str | os.PathLike[str] = SHM_DIR) -> frozenset[str]:
    """The names of the files in ``shm_dir`` now that an engine may leave (``PATTERNS``)."""
    with contextlib.suppress(OSError):
        return frozenset(p.name for pattern in PATTERNS for p in Path(shm_dir).glob(pattern))
    return frozenset()


def _proc_entries() -> list[str]:
    with contextlib.suppress(OSError):
        return [e for e in os.listdir("/proc") if e.isdigit()]
    return []


def _alive_in(groups: Collection[int]) -> bool:
    """Whether a process (not a zombie: it has let go of its mappings) is in one of ``groups``."""
    for pid in _proc_entries():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) in groups:
            return True
    return False


FileId = tuple[int, int, int]  # (device major, device minor, inode)


def _file_id(st: os.stat_result) -> FileId:
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def mapped(files: Collection[FileId]) -> set[FileId]:
    """Those of ``files`` that a live process this user may inspect maps. By device and inode:
    the process that created a semaphore maps it under a temporary name it then unlinked."""
    found: set[FileId] = set()
    if not files:
        return found
    for pid in _proc_entries():
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if len(fields) < 6 or fields[4] == "0":
                        continue
                    major, _, minor = fields[3].partition(":")
                    fid = (int(major, 16), int(minor, 16), int(fields[4]))
                    if fid in files:
                        found.add(fid)
        except (OSError, ValueError):  # gone, or another user's (it cannot map our 0600 files)
            continue
    return found


def sweep_semaphores(before: Collection[str], groups: Iterable[int] = (),
                     shm_dir: str | os.PathLike[str] = SHM_DIR,
                     wait_s: float = GROUP_WAIT_S) -> list[str]:
    """After stopping engines: remove the semaphore files in ``shm_dir`` that are not in
    ``before`` (:func:`semaphores` before they started), are this user's, and no live process
    maps. First waits, up to ``wait_s``, until no process of the process ``groups`` just stopped
    is left (a SIGKILLed process keeps its mappings until it is gone). Returns the names
    removed; never raises for a file that is gone or cannot be removed."""
    groups = set(groups)
    deadline = time.monotonic() + wait_s
    while groups and _alive_in(groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    root = Path(os.path.realpath(shm_dir))
    uid = os.geteuid()
    candidates: dict[str, FileId] = {}
    for name in semaphores(root) - set(before):
        with contextlib.suppress(OSError):
            st = (root / name).lstat()
            if st.st_uid == uid:
                candidates[name] = _file_id(st)
    busy = mapped(set(candidates.values()))
    removed = []
    for name, fid in sorted(candidates.items()):
        if fid in busy:
            continue
        with contextlib.suppress(OSError):
            os.unlink(root / name)
            removed.append(name)
    return removed
