"""``MooncakePagePool`` on a real Mooncake Store across test hosts
(``radix_global_tools/cluster/hosts.py``): the master on host ``m``, a writer client on host ``a``,
readers on host ``b``. No engines.

- Pages put on A are read intact on B, and B's link carried them (veth counters). Half of them
  move one call each, packed through the staging slots, half zero-copy in one multi-buffer call.
- A page corrupted in the store fails its checksum on B, on either path: a miss, and it is
  removed. With
  verification off (the test-only switch) the same corruption reaches the reader: the negative
  control.
- The writer's host dies: its pages become misses on B (never wrong bytes, never a hang) and
  leave the store within Mooncake's client_ttl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from radix_global_tools.cluster.hosts import HostSet
from sglang_patch.pool.mooncake_stall import DEFAULT_READ_STALL_S

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DRIVER = Path(__file__).with_name("mooncake_driver.py")
REPO = Path(__file__).resolve().parents[2]
N = 8
PAGE = 64 * 1024
STALL_PAGE = 1 << 20  # 16 of Mooncake's 64 KiB TCP slices
SLOW_MBIT = 4.0  # A's cable while B reads: 1 Mbit/s a lane, a page in ~8 s, a slice in 0.5 s
# Mooncake's TCP lanes per peer (MC_TCP_LANES_PER_PEER): transfers past them queue, and in this
# build a queued transfer to a dead peer waits for the store's fixed 60 s batch deadline
# (docs/interfaces.md, the stall's bound)
LANES = 4
CUT_AFTER_S = 2.0  # into B's read, A's cable is pulled
# the bound, plus the rest of a read cut short (queued transfers, the lost host's skips), well
# under the transport's own 30 s
LIMIT_S = CUT_AFTER_S + DEFAULT_READ_STALL_S + 8


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def _start_master(hosts: HostSet) -> str:
    """``mooncake_master`` on host ``m``; its address."""
    hosts.spawn("m", "master", [str(Path(sys.executable).parent / "mooncake_master"),
                                "--rpc_port=50051", "--metrics_port=9003"])
    time.sleep(2.0)
    return f"{hosts['m'].address}:50051"


def _read(hosts: HostSet, master: str, **env: str) -> dict[str, Any]:
    argv = hosts.argv("b", [sys.executable, str(DRIVER), master, hosts["b"].address, "read",
                            str(N)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env(**env),
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_pages_cross_hosts_through_mooncake_and_bad_bytes_never_load(tmp_path: Path) -> None:
    with HostSet(["m", "a", "b"], tmp_path) as hosts:
        master = _start_master(hosts)
        writer = subprocess.Popen(
            hosts.argv("a", [sys.executable, str(DRIVER), master, hosts["a"].address, "write",
                             str(N)]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_env())
        try:
            assert writer.stdout is not None and writer.stdin is not None
            ready = json.loads(writer.stdout.readline() or "{}")
            assert ready.get("ready"), writer.stderr.read() if writer.poll() is not None else ""
            assert all(ready["stored"]) and all(ready["new"]) and ready["again_new"] is False

            before = hosts.bytes("b")
            first = _read(hosts, master)
            moved = hosts.bytes("b").rx - before.rx
            assert first["got"] == [True] * N and first["equal"] == [True] * N, first
            # a call per page of the first half, one zero-copy call for the second half
            assert first["batch_calls"] == N // 2 + 1 and first["zero_copy_calls"] == 1, first
            assert moved >= N * PAGE, moved  # the pages live in A's segment

            for i in (0, N - 1):  # one packed page, one zero-copy page
                writer.stdin.write(f"corrupt {i}\n")
                writer.stdin.flush()
                assert json.loads(writer.stdout.readline())["corrupted"]
            blind = _read(hosts, master, RADIX_GLOBAL_POOL_NO_VERIFY="1")
            bad = [(g, e) for i, (g, e) in enumerate(zip(blind["got"], blind["equal"],
                                                         strict=True)) if i in (0, N - 1)]
            assert bad == [(True, False)] * 2, blind  # negative control: wrong bytes "load"
            checked = _read(hosts, master)
            assert checked["got"] == [False] + [True] * (N - 2) + [False], checked
            assert checked["checksum_failures"] == 2, checked
            assert checked["exists"][0] is False and checked["exists"][-1] is False, checked

            hosts.fail("a")  # the writer's host: its segment and pages are gone
            # the master still lists a's pages: the reader's first read of a stalls (the
            # connect to a dead host), then it skips every page there, not one stall per page
            after = _read(hosts, master)
            assert after["lost_hosts"] == [hosts["a"].address], after
            assert after["lost_skips"] >= N - 1 and not any(after["got"]), after
            deadline = time.monotonic() + 40
            while True:
                after = _read(hosts, master)
                assert not any(g and not e for g, e in zip(after["got"], after["equal"],
                                                           strict=True)), after
                if not any(after["exists"]):
                    break
                assert time.monotonic() < deadline, after
                time.sleep(2.0)
            assert not any(after["got"])
        finally:
            if writer.poll() is None:
                writer.kill()
            writer.wait(timeout=10)


def test_silent_evictions_are_found_by_the_resync_probe(tmp_path: Path) -> None:
    """More pages than a segment holds: Mooncake evicts at its high watermark and tells no one.
    ``vanished`` names exactly the pages gone from the store (here, written oldest first, the
    pages it forgets unprobed are evicted ones too). Without it, an index fed only by
    the store events would hold every page in ``missing`` (the negative control: non-empty)."""
    with HostSet(["m", "a"], tmp_path) as hosts:
        master = _start_master(hosts)
        argv = hosts.argv("a", [sys.executable, str(DRIVER), master, hosts["a"].address,
                                "fill", "400"])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env(),
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["missing"], got  # evictions happened, silently
    assert got["vanished"] == got["missing"] and got["again"] == [], got


def test_a_read_in_flight_to_a_dead_host_gives_up_within_the_bound(tmp_path: Path) -> None:
    """B reads A's pages over a slow cable, one transfer per lane (``LANES``), each slice
    (64 KiB) well inside the bound. With the cable in, every page arrives (a slow live link is
    not cut). With the cable pulled mid-read no reset comes back, and the transport's deadlines
    (``sglang_patch/pool/mooncake_stall.py``) end the read ``DEFAULT_READ_STALL_S`` after the
    last slice: a miss for every page it did not get, A taken as lost, never a wrong page.
    Negative control, run by hand: this test with ``MC_TCP_STATUS_TIMEOUT_SEC=30
    MC_TCP_PROGRESS_TIMEOUT_SEC=30`` in pytest's environment (an operator's value wins; 30 s
    is the transport's own default) fails on ``LIMIT_S``."""
    n, page = 1 + LANES, STALL_PAGE
    with HostSet(["m", "a", "b"], tmp_path) as hosts:
        master = _start_master(hosts)

        def driver(host: str, mode: str) -> subprocess.Popen[str]:
            argv = [sys.executable, str(DRIVER), master, hosts[host].address, mode, str(n),
                    str(page)]
            proc = subprocess.Popen(hosts.argv(host, argv), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=_env())
            procs.append(proc)
            assert proc.stdout is not None
            assert json.loads(proc.stdout.readline() or "{}").get("ready"), f"{mode} failed"
            return proc

        def read(cut: bool) -> tuple[dict[str, Any], str]:
            reader = driver("b", "stall")
            assert reader.stdin is not None
            reader.stdin.write("go\n")
            reader.stdin.flush()
            if cut:
                time.sleep(CUT_AFTER_S)
                hosts.link("a", False)
            out, err = reader.communicate(timeout=120)
            return dict(json.loads(out.strip().splitlines()[-1])), err

        procs: list[subprocess.Popen[str]] = []
        try:
            driver("a", "write")
            hosts.shape("a", SLOW_MBIT)
            live, _ = read(cut=False)
            cut, err = read(cut=True)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)
    print("live:", live, "cut:", cut)
    assert live["got"] == n - 1 and live["wrong"] == [] and live["lost_hosts"] == [], live
    assert cut["elapsed_s"] > CUT_AFTER_S, cut  # it was in flight when the cable went
    assert cut["wrong"] == [] and cut["got"] < n - 1, cut
    assert cut["lost_hosts"] == [hosts["a"].address], cut
    assert cut["elapsed_s"] < LIMIT_S, (cut, err[-2000:])
