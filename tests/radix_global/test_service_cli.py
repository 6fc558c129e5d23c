"""`radix-global index serve` as a real process: serve, snapshot on SIGTERM, restore on restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from radix_global.client import IndexClient, NotAuthorizedError
from radix_global.keys import page_keys
from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.types import Location, Namespace, Tier, WorkerId

NS = Namespace("tiny@1")
ROOT = Path(__file__).resolve().parents[2]


def _start(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "radix_global_cli", "index", "serve", "--port", "0", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "serving on" in line:
            return proc, line.rsplit(" ", 1)[-1].strip()
        if not line and proc.poll() is not None:
            break
    _kill(proc)
    raise AssertionError(f"index service did not start: {proc.returncode}")


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    finally:
        _kill(proc)


@pytest.mark.e2e
def test_serve_snapshot_on_sigterm_and_restore(tmp_path: Path) -> None:
    snap = tmp_path / "index.snap"
    args = ("--snapshot", str(snap), "--admin-token", "tok", "--shards", "2")
    keys = page_keys(list(range(40)), 4)
    proc, target = _start(*args)
    try:
        with IndexClient(target, admin_token="tok") as client:
            client.register(WorkerInfo(worker_id="sgl-0", url="http://127.0.0.1:30000",
                                       model="tiny", namespace=NS, page_size=4))
            client.apply(StorePages(NS, Location(WorkerId("sgl-0"), 0, Tier.GPU), None, keys))
            before = client.match(NS, keys)
            assert before.best_pages == len(keys)
        with IndexClient(target) as anon, pytest.raises(NotAuthorizedError):
            anon.deregister(WorkerId("sgl-0"))
        assert _stop(proc) == 0
    finally:
        _kill(proc)
    assert snap.stat().st_size > 0
    proc, target = _start(*args)
    try:
        with IndexClient(target, admin_token="tok") as client:  # Match needs it too (issue 35)
            assert client.match(NS, keys) == before
            assert client.stats()["service"]["workers"] == 1
        assert _stop(proc) == 0
    finally:
        _kill(proc)
    snap.write_bytes(b"RGIXSNAP broken")
    bad = subprocess.run(
        [sys.executable, "-m", "radix_global_cli", "index", "serve", "--port", "0",
         "--snapshot", str(snap)], cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "cannot start" in bad.stderr and "truncated" in bad.stderr
