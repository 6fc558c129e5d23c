"""The sweep of the semaphore files engines leave in /dev/shm (sglang_patch/sem_sweep.py; issue
35, item 14): only what appeared since the snapshot, only this user's, never what a live process
maps."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys

import pytest

from sglang_patch.sem_sweep import SHM_DIR, semaphores, sweep_semaphores


def sem(root, name: str) -> None:
    (root / f"sem.mp-{name}").write_bytes(bytes(32))


def test_only_the_new_unmapped_files_of_this_user_are_removed(tmp_path):
    sem(tmp_path, "old")  # another session's, from before this harness started its engines
    (tmp_path / "psm_pool").write_bytes(b"x")  # not a semaphore
    before = semaphores(tmp_path)
    assert before == {"sem.mp-old"}
    sem(tmp_path, "left1")  # what a stopped engine left
    sem(tmp_path, "left2")
    sem(tmp_path, "live")  # a running engine's (another session's): mapped
    with open(tmp_path / "sem.mp-live", "r+b") as f, mmap.mmap(f.fileno(), 32):
        removed = sweep_semaphores(before, shm_dir=tmp_path)
    assert removed == ["sem.mp-left1", "sem.mp-left2"]
    assert semaphores(tmp_path) == {"sem.mp-old", "sem.mp-live"}
    assert (tmp_path / "psm_pool").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file away")
def test_another_users_file_is_left_alone(tmp_path):
    before = semaphores(tmp_path)
    sem(tmp_path, "theirs")
    os.chown(tmp_path / "sem.mp-theirs", 54321, -1)
    assert sweep_semaphores(before, shm_dir=tmp_path) == []
    assert semaphores(tmp_path) == {"sem.mp-theirs"}


CHILD = """
import multiprocessing as mp, sys, time
lock = mp.get_context("spawn").Lock()  # unlinked by the resource tracker, if it lives
print(lock._semlock.name, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")
def test_what_a_killed_process_group_left_in_dev_shm_is_removed():
    """The leak itself: a process group SIGKILLed (as the harnesses end engines) takes the
    resource tracker with it, and the semaphore file stays until the sweep."""
    before = semaphores()
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        name = "sem." + proc.stdout.readline().decode().strip().lstrip("/")
        assert name in semaphores()
        assert name not in sweep_semaphores(before, wait_s=0)  # still mapped: kept
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert name in semaphores()  # the leak
    assert name in sweep_semaphores(before, groups=[proc.pid])
    assert name not in semaphores()


def test_sglangs_load_snapshot_slots_are_swept_too(tmp_path):
    """SGLang's load snapshot slot files (``sglang_loads_*.shm``) are left by a killed engine
    like its semaphores (70 of them after one ``make test``)."""
    before = semaphores(tmp_path)
    (tmp_path / "sglang_loads_0a1b2c_d3e4f5.shm").write_bytes(bytes(64))
    (tmp_path / "sglang_other.shm").write_bytes(b"x")  # not one of ours to judge
    assert sweep_semaphores(before, shm_dir=tmp_path) == ["sglang_loads_0a1b2c_d3e4f5.shm"]
    assert (tmp_path / "sglang_other.shm").exists()
