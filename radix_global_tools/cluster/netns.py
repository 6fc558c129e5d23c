"""Network namespaces, the low-level part of the test hosts
(``radix_global_tools/cluster/hosts.py``): the ``ip`` commands, killing what runs in a namespace,
sweeping the namespaces of crashed runs, and calls made from inside a namespace by a process that
lives outside it.

Nothing of a test host set listens on the root namespace, so a test or a benchmark that wants to
talk to a router on host ``r`` sends from ``r``'s (or a client host's) namespace. Linux keeps the
network namespace per thread (``setns(2)`` with ``CLONE_NEWNET`` moves only the calling thread),
so a thread pool whose threads entered the namespace is such a sender; sockets are created in the
namespace of the thread that makes them:

    with netns_executor("rgh123-r") as run_there:
        resp = run_there.submit(httpx.get, "http://10.77.0.4:30080/health").result()

Contract: every network call must run in the executor's threads; a connection pool created
elsewhere is fine as long as its connections are opened there. Entering needs CAP_SYS_ADMIN
(root); a namespace that does not exist breaks the pool at its first task. Such threads keep a
namespace alive after its name is deleted: shut the executor down first. (gRPC opens its
connections on threads of its own: call it from a process started inside the namespace.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PREFIX = "rgh"
POOL_BASE = Path("/dev/shm/radix-global-hosts")


class HostError(RuntimeError):
    """A host set that cannot be made or a request it refuses (message says why)."""


def remove_stale(prefix: str = PREFIX) -> list[str]:
    """Namespaces ``{prefix}<pid>-*`` whose owner pid is no longer alive (a crashed earlier run):
    kill their processes, delete them and ``/dev/shm/radix-global-hosts/<pid>``; returns the
    removed names. Sets of live owners are left alone (so is one whose pid was reused)."""
    removed = []
    for ns in netns_list():
        m = re.fullmatch(rf"{re.escape(prefix)}(\d+)-[a-z0-9]+", ns)
        if m and not alive(int(m[1])):
            kill_netns(ns, 5.0)
            with contextlib.suppress(HostError):
                ip("netns", "del", ns)
                removed.append(ns)
    with contextlib.suppress(OSError):  # also pools whose namespaces went already
        for d in POOL_BASE.iterdir():
            if d.name.isdigit() and not alive(int(d.name)):
                shutil.rmtree(d, ignore_errors=True)
    return removed


def run(argv: Sequence[str], timeout_s: float = 10.0) -> str:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostError(f"{shlex.join(argv)}: {e}") from e
    if r.returncode != 0:
        raise HostError(f"{shlex.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def ip(*args: str) -> str:
    return run(["ip", *args])


def netns_list() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def kill_netns(ns: str, timeout_s: float) -> list[int]:
    """SIGKILL everything in ``ns`` until it is empty (a process may fork meanwhile); returns
    the pids still there at the deadline. A missing namespace is empty."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pids = [int(p) for p in ip("netns", "pids", ns).split()]
        except HostError:
            return []
        pids = [p for p in pids if p not in (1, os.getpid())]
        if not pids or time.monotonic() > deadline:
            return pids
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.02)


CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"  # where `ip netns add` keeps the namespaces' handles


def enter_netns(name: str) -> None:
    """Move the calling thread into the named network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def netns_executor(name: str, workers: int = 8) -> ThreadPoolExecutor:
    """A thread pool whose every thread runs inside network namespace ``name``."""
    return ThreadPoolExecutor(workers, thread_name_prefix=f"netns-{name}",
                              initializer=enter_netns, initargs=(name,))
