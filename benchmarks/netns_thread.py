"""Calls made from inside a test host's network namespace, by a process that lives outside it.

Nothing of a test host set listens on the root namespace (``benchmarks/hosts.py``), so a test
or a benchmark that wants to talk to a router on host ``r`` sends from ``r``'s (or a client
host's) namespace. Linux keeps the network namespace per thread (``setns(2)`` with
``CLONE_NEWNET`` moves only the calling thread), so a thread pool whose threads entered the
namespace is such a sender; sockets are created in the namespace of the thread that makes them.

    with netns_executor("rgh123-r") as run:
        resp = run.submit(httpx.get, "http://10.77.0.4:30080/health").result()

Contract: every network call must run in the executor's threads; a connection pool created
elsewhere is fine as long as its connections are opened there. Entering needs CAP_SYS_ADMIN
(root); a namespace that does not exist breaks the pool at its first task
(``BrokenThreadPool`` with the ``OSError`` as its cause).
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor

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
