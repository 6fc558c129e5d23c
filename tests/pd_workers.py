"""Real SGLang CPU workers started through our launch wrapper (``radix-global sglang``), for the
prefill/decode tests (``tests/sglang_patch/test_pd_pool_e2e.py``, ``tests/router/
test_pd_pool_http_e2e.py``).

    from pd_workers import PAGE, CPU_FLAGS, prompt, spawn, stop, wait_healthy

``spawn`` runs ``python -m sglang_patch.launch_server <CPU_FLAGS> <args>`` in its own session
with its log in a temp file; ``stop`` ends the wrapper and every engine process it started;
``kill`` SIGKILLs them (a crashed worker). Both then remove the semaphore files the worker's
processes left in /dev/shm (``sglang_patch.sem_sweep``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
from servers import _healthy, free_port

from radix_global import trace
from sglang_patch import cpu_compat
from sglang_patch.sem_sweep import semaphores, sweep_semaphores

PAGE = 4
REPO = Path(__file__).resolve().parents[1]
ENGINE_FLAGS = [*cpu_compat.CPU_SERVER_FLAGS, "--dtype", "float32",
                "--max-total-tokens", "8192", "--page-size", str(PAGE), "--hicache-ratio", "2"]
# For workers without --radix-global-role decode (which gets these from the launch wrapper itself):
CPU_FLAGS = [*ENGINE_FLAGS, "--hicache-storage-prefetch-policy", "wait_complete",
             # SGLang skips L3 prefetches under 256 tokens by default; a turn's new part is less
             "--hicache-storage-backend-extra-config", '{"prefetch_threshold": 4}']


class Worker:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], url: str, log: Path,
                 sems: frozenset[str] = frozenset()) -> None:
        self.name, self.proc, self.url, self.log = name, proc, url, log
        self.sems = sems  # /dev/shm semaphores before it started (sglang_patch.sem_sweep)

    def engine_pids(self) -> list[int]:
        with contextlib.suppress(psutil.NoSuchProcess):
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        return []

    def tail(self) -> str:
        return self.log.read_bytes()[-4000:].decode("utf-8", "replace")


def spawn(name: str, model: Path, args: Sequence[str],
          flags: Sequence[str] = tuple(CPU_FLAGS), env: dict[str, str] | None = None) -> Worker:
    port = free_port()
    fd, log = tempfile.mkstemp(prefix=f"rg-pd-{name}-", suffix=".log")
    os.close(fd)
    argv = [sys.executable, "-m", "sglang_patch.launch_server", "--model-path", str(model),
            "--host", "127.0.0.1", "--port", str(port), *flags, *args]
    sems = semaphores()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO),
                                env={**os.environ, **(env or {})}, start_new_session=True)
    return Worker(name, proc, f"http://127.0.0.1:{port}", Path(log), sems)


def wait_healthy(workers: Sequence[Worker], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for w in workers:
        while not _healthy(w.url):
            assert w.proc.poll() is None, f"{w.name} exited:\n{w.tail()}"
            assert time.monotonic() < deadline, f"{w.name} not healthy:\n{w.tail()}"
            time.sleep(0.25)  # a start-up ends at any moment: poll often


def kill(w: Worker) -> None:
    """SIGKILL the engine and the wrapper: a worker that crashed."""
    pids = [*w.engine_pids(), w.proc.pid]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    w.proc.wait(timeout=60)
    # the engine's pid is its process group (the wrapper starts it in its own session)
    sweep_semaphores(w.sems, groups=pids)


def stop(w: Worker) -> None:
    pids = w.engine_pids()
    if w.proc.poll() is None:
        w.proc.send_signal(signal.SIGTERM)
        try:
            w.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            w.proc.kill()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    sweep_semaphores(w.sems, groups=[w.proc.pid, *pids])


def prompt(hash_ids: list[int], per_block: int = 48) -> list[int]:
    """``per_block`` tokens per hash id (trace lengths are in 512-token blocks)."""
    return trace.synthesize_prompt(hash_ids, len(hash_ids) * 512, per_block)
