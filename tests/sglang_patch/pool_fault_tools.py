"""Helpers for the pool fault and fuzz tests: run a pool operation in a forked child with a time
bound (a hang or a fatal signal there fails the test instead of freezing or killing pytest), and
raw views of a pool's files for damaging them from outside."""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from sglang_patch.pool import shm_meta as m


def page(seed: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _child(fn: Callable[..., Any], args: tuple[Any, ...], conn: Any) -> None:
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as exc:
        conn.send(("raised", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class Child:
    """``fn(*args)`` running in a forked child; :meth:`result` waits for it with a bound."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        ctx = mp.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, args=(fn, args, send))
        self._proc.start()
        send.close()

    def result(self, timeout: float = 10.0) -> tuple[str, Any]:
        """``("ok", value)``, ``("raised", text)``, ``("signal", signum)`` (it died: SIGBUS,
        SIGSEGV...) or ``("hang", None)`` (killed after ``timeout`` seconds)."""
        proc = self._proc
        try:
            if self._recv.poll(timeout):
                try:
                    return self._recv.recv()  # type: ignore[no-any-return]
                except EOFError:
                    pass  # died before sending
            else:
                proc.kill()
                proc.join(10)
                return ("hang", None)
        finally:
            self._recv.close()
            proc.join(10)
        code = proc.exitcode or 0
        return ("signal", -code) if code < 0 else ("raised", f"exit code {code}")


def in_child(fn: Callable[..., Any], *args: Any, timeout: float = 10.0) -> tuple[str, Any]:
    """``fn(*args)`` in a forked child (see :meth:`Child.result`)."""
    return Child(fn, *args).result(timeout)


class MetaViews:
    """Writable numpy views of a pool's ``meta`` file (whatever shape its header claims)."""

    def __init__(self, pool_dir: str, nslots: int) -> None:
        self.path = os.path.join(pool_dir, "meta")
        raw = np.memmap(self.path, dtype=np.uint8, mode="r+", shape=(m.meta_bytes(nslots),))
        end_slots = m.HEADER_WORDS * 8 + nslots * m.SLOT_DTYPE.itemsize
        self._raw = raw
        self.header = raw[: m.HEADER_WORDS * 8].view("<u8")
        self.slots = raw[m.HEADER_WORDS * 8 : end_slots].view(m.SLOT_DTYPE)
        self.table = raw[end_slots:].view("<i4")

    def flush(self) -> None:
        self._raw.flush()
