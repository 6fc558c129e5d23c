"""Start and stop real SGLang server processes on CPU for end-to-end tests.

    from servers import sglang_server            # tests/ is on sys.path (tests/conftest.py)
    with sglang_server(model_dir, extra_args=["--page-size", "4"]) as srv:
        httpx.post(srv.url + "/generate", json={...})

Contract
- The server runs ``python -m sglang_patch.cpu_compat -- --model-path M --host 127.0.0.1
  --port P <CPU flags> <defaults> <extra_args>`` in its own process group, with
  ``cpu_compat.child_env()`` (so SGLang's spawned scheduler/detokenizer get the CPU stand-ins)
  plus ``env``. CPU flags: ``--device cpu --attention-backend torch_native --sampling-backend
  pytorch --disable-overlap-schedule``. Defaults (dropped when ``extra_args`` sets the same flag):
  ``--dtype float32`` (SGLang's "auto" turns a float32 checkpoint into float16, ~3x slower on
  this CPU), ``--max-total-tokens 65536`` (otherwise SGLang sizes the KV pool from the machine's
  free RAM: gigabytes, zero-filled, on a shared box), ``--log-level info``. With
  ``--enable-hierarchical-cache`` the HiCache CPU patches (``sglang_patch.hicache_cpu``) are
  registered so the scheduler process applies them.
- Ready = ``GET /health`` answers 200 (SGLang answers 503 until its warm-up request is done).
  Startup failure (process exit or ``startup_timeout``) raises ``ServerStartError`` carrying the
  log tail. Startup takes ~15 s on an idle 2-core machine, minutes when the cores are shared.
- On exit the whole process group gets SIGTERM, then SIGKILL after ``stop_timeout``; the log file
  (``RunningServer.log_path``) is kept. The semaphore files the server left in /dev/shm are
  removed (``sglang_patch.sem_sweep``: those that appeared since its start and no live process
  maps).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from sglang_patch import cpu_compat
from sglang_patch.ports import free_port
from sglang_patch.sem_sweep import semaphores, sweep_semaphores

DEFAULT_ARGS: tuple[tuple[str, str | None], ...] = (
    ("--dtype", "float32"),
    ("--max-total-tokens", "65536"),
    ("--log-level", "info"),
)
REPO_ROOT = cpu_compat.REPO_ROOT


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message holds its log tail."""

    def __init__(self, message: str, pid: int, log_path: Path) -> None:
        super().__init__(message)
        self.pid = pid  # process group id (already stopped when the error propagates)
        self.log_path = log_path


class RunningServer(NamedTuple):
    url: str  # http://127.0.0.1:PORT
    port: int
    pid: int  # also the process group id
    log_path: Path
    argv: tuple[str, ...]

    def log_tail(self, chars: int = 6000) -> str:
        return _tail(self.log_path, chars)


def server_argv(model_path: str | os.PathLike[str], port: int, extra_args: Sequence[str] = (),
                host: str = "127.0.0.1") -> list[str]:
    """The full command line (CPU flags + defaults not overridden by ``extra_args``)."""
    defaults: list[str] = []
    for flag, value in DEFAULT_ARGS:
        if flag not in extra_args and not any(a.startswith(flag + "=") for a in extra_args):
            defaults += [flag] if value is None else [flag, value]
    return cpu_compat.launch_cpu_server_argv(model_path, port, [*defaults, *extra_args],
                                             host=host, python=sys.executable)


def _tail(path: Path, chars: int) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "<no log>"
    return data[-chars:].decode("utf-8", "replace")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _stop(proc: subprocess.Popen[bytes], stop_timeout: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure no child of the group (scheduler) outlives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


@contextlib.contextmanager
def sglang_server(
    model_path: str | os.PathLike[str],
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    startup_timeout: float = 420.0,
    stop_timeout: float = 15.0,
    log_path: str | os.PathLike[str] | None = None,
) -> Iterator[RunningServer]:
    """Run one real SGLang server on CPU for the duration of the ``with`` block."""
    port = port or free_port(host)
    argv = server_argv(model_path, port, extra_args, host)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"sglang-{port}-", suffix=".log")
        os.close(fd)
        log_path = name
    log = Path(log_path)
    if "--enable-hierarchical-cache" in extra_args:
        # Registers the HiCache host-pool patches so child_env() hands them to the scheduler.
        import sglang_patch.hicache_cpu
    if "--enable-lora" in extra_args:
        import sglang_patch.lora_cpu  # noqa: F401  (registers its patch likewise)
    child_env = cpu_compat.child_env({**os.environ, **(env or {})})
    url = f"http://{host}:{port}"
    sems = semaphores()
    with open(log, "wb") as out:
        out.write(("$ " + " ".join(argv) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=child_env,
                                cwd=str(REPO_ROOT), start_new_session=True)
    server = RunningServer(url, port, proc.pid, log, tuple(argv))
    try:
        deadline = time.monotonic() + startup_timeout
        while not _healthy(url):
            if proc.poll() is not None:
                raise ServerStartError(
                    f"SGLang exited with {proc.returncode} during startup; log {log}:\n"
                    f"{server.log_tail()}", proc.pid, log)
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"SGLang not healthy after {startup_timeout:.0f} s; log {log}:\n"
                    f"{server.log_tail()}", proc.pid, log)
            time.sleep(0.25)  # a start-up ends at any moment: poll often
        yield server
    finally:
        _stop(proc, stop_timeout)
        sweep_semaphores(sems, groups=[proc.pid])
