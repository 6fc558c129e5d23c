"""Processes of a benchmark or test cluster, local or on test hosts: their record, log tail,
bounded waits for them to answer and their stop (``radix_global_tools/cluster/local.py``,
``radix_global_tools/cluster/host_cluster.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import httpx


class ClusterError(RuntimeError):
    """A process of the cluster did not start (the message holds its log tail)."""


class Proc(NamedTuple):
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log_tail(self, chars: int = 4000) -> str:
        return log_tail(self.log_path, chars)


def log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_bytes()[-chars:].decode("utf-8", "replace")
    except OSError:
        return "<no log>"


class Started(Protocol):
    """What the waits need of a started process (:class:`Proc`, ``host_cluster.HostProc``)."""

    @property
    def name(self) -> str: ...
    @property
    def popen(self) -> subprocess.Popen[bytes]: ...
    @property
    def url(self) -> str: ...
    @property
    def log_path(self) -> Path: ...
    def log_tail(self, chars: int = 4000) -> str: ...


def wait_answering(procs: Sequence[Started], get: Callable[[str], int], path: str,
                   accept: tuple[int, ...], timeout_s: float) -> None:
    """Until every process answers ``GET url + path`` (``get`` returns the status) with a status
    in ``accept``; :class:`ClusterError` with the log tail when one exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    waiting = list(procs)
    while waiting:
        for p in list(waiting):
            if p.popen.poll() is not None:
                raise ClusterError(f"{p.name} exited with {p.popen.returncode}; log "
                                   f"{p.log_path}:\n{p.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if get(p.url + path) in accept:
                    waiting.remove(p)
        if waiting and time.monotonic() > deadline:
            p = waiting[0]
            raise ClusterError(f"{p.name} not answering {path} after {timeout_s} s; log "
                               f"{p.log_path}:\n{p.log_tail()}")
        if waiting:
            time.sleep(0.2)


def stop_group(popen: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the process group, SIGKILL after ``timeout_s``, and kill its stragglers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, sig)
        try:
            popen.wait(timeout=timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # stragglers of the group
        os.killpg(popen.pid, signal.SIGKILL)
