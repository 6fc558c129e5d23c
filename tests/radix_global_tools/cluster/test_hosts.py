"""radix_global_tools/cluster/hosts.py on real network namespaces (root, ``ip``; no engines):
connectivity, byte counts, isolation from the root namespace, cable pulls, host failure, shaping,
stale sweeps and the pool-argument check. Every namespace a test makes is removed, also when it
fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from radix_global_tools.cluster import netns
from radix_global_tools.cluster.hosts import HostSet, LinkBytes
from radix_global_tools.cluster.netns import POOL_BASE, HostError, remove_stale

# Real namespaces and processes (root, iproute2): with the end-to-end tests, not the unit ones.
pytestmark = pytest.mark.e2e
MIB = 1 << 20

SERVER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
while True:
    c, _ = s.accept()
    n = 0
    while chunk := c.recv(1 << 16):
        n += len(chunk)
    c.sendall(str(n).encode())
    c.close()
"""

CLIENT = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
c.settimeout(20)
t = time.monotonic()
c.sendall(b"x" * int(sys.argv[3]))
c.shutdown(socket.SHUT_WR)
print(c.recv(64).decode(), time.monotonic() - t)
"""


def _netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _ours() -> list[str]:
    return [ns for ns in _netns() if ns.startswith(f"rgh{os.getpid()}-")]


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    yield
    left = _ours()
    for ns in left:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert not left, f"namespaces left behind: {left}"


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[HostSet]:
    hs = HostSet(["a", "b"], tmp_path)
    try:
        hs.up()
    except HostError as e:
        pytest.fail(f"cannot make namespaces: {e}")
    try:
        yield hs
    finally:
        hs.close()


def serve(hs: HostSet, host: str) -> tuple[subprocess.Popen[bytes], int]:
    """A byte-counting TCP server on the host's address; returns once it listens."""
    port = hs.free_port(host)
    popen = hs.spawn(host, "server", [sys.executable, "-c", SERVER, hs[host].address, str(port)])
    deadline = time.monotonic() + 5.0
    while f":{port} " not in subprocess.run(["ss", "-N", hs[host].netns, "-Hltn"],
                                           capture_output=True, text=True).stdout:
        assert popen.poll() is None, hs.log_path(host, "server").read_text()
        assert time.monotonic() < deadline, "server did not listen within 5 s"
        time.sleep(0.02)
    return popen, port


def send(hs: HostSet, src: str, dst: str, port: int, n: int,
         connect_timeout_s: float = 2.0) -> tuple[int, float] | None:
    """``n`` bytes from ``src`` to ``dst``: (bytes the server counted, seconds), None if the
    connection failed."""
    r = subprocess.run(hs.argv(src, [sys.executable, "-c", CLIENT, hs[dst].address, str(port),
                                     str(n), str(connect_timeout_s)]),
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return None
    got, seconds = r.stdout.split()
    return int(got), float(seconds)


def _root_has_set_addresses() -> bool:
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    return any(a.get("local", "").startswith("10.77.0.")
               for link in json.loads(out) for a in link.get("addr_info", []))


def test_two_hosts_talk_over_the_bridge_and_close_removes_all(tmp_path: Path) -> None:
    hs = HostSet(["a", "b"], tmp_path)
    with hs:
        assert {hs["a"].netns, hs["b"].netns, hs.bridge_netns} <= set(_netns())
        assert Path(hs["a"].pool_root).is_dir() and Path(hs["b"].pool_root).is_dir()
        assert hs.bytes("a") == hs.bytes("b") == LinkBytes(0, 0)  # no chatter: counts are ours
        _, port = serve(hs, "a")
        before = hs.bytes("a")
        result = send(hs, "b", "a", port, 2 * MIB)
        assert result is not None and result[0] == 2 * MIB
        after = hs.bytes("a")
        assert after.rx - before.rx >= 2 * MIB
        assert hs.bytes("b").tx >= 2 * MIB
        assert hs.pids("a") and not hs.pids("b")
        assert hs.url("a", port) == f"http://10.77.0.2:{port}"
        assert hs.log_path("a", "server").read_text().startswith("$ ip netns exec ")
    assert not _ours()
    assert not Path(hs["a"].pool_root).exists() and not hs.pool_base.exists()
    hs.close()  # idempotent


def test_root_namespace_gets_no_address_link_or_listener(tmp_path: Path) -> None:
    assert not _root_has_set_addresses()
    with HostSet(["a", "b"], tmp_path) as hs:
        _, port = serve(hs, "a")
        assert not _root_has_set_addresses()
        links = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True,
                               check=True).stdout
        names = {link["ifname"] for link in json.loads(links)}
        assert not names & {"v-a", "v-b"}
        root_ss = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
        assert f":{port} " not in root_ss
    assert not _root_has_set_addresses()


def test_pulled_cable_fails_fast_and_plugged_works_again(hosts: HostSet) -> None:
    _, port = serve(hosts, "a")
    hosts.link("a", False)
    start = time.monotonic()
    assert send(hosts, "b", "a", port, 1000, connect_timeout_s=1.0) is None
    assert time.monotonic() - start < 3.0
    hosts.link("a", True)
    back = send(hosts, "b", "a", port, 1000, connect_timeout_s=3.0)
    assert back is not None and back[0] == 1000


def test_fail_kills_what_runs_on_the_host(hosts: HostSet) -> None:
    sleeper = hosts.spawn("a", "sleeper", ["sleep", "60"])
    other = hosts.spawn("b", "sleeper", ["sleep", "60"])
    assert sleeper.pid in hosts.pids("a")
    hosts.fail("a")
    assert sleeper.poll() is not None and not hosts.pids("a")
    assert other.poll() is None  # the other host lives on
    hosts.restore("a")
    _, port = serve(hosts, "a")
    assert send(hosts, "b", "a", port, 1000, connect_timeout_s=3.0) is not None


def test_shape_limits_the_cable_both_ways_and_unshape_lifts_it(hosts: HostSet) -> None:
    _, port_a = serve(hosts, "a")
    _, port_b = serve(hosts, "b")
    hosts.shape("a", 20)
    into = send(hosts, "b", "a", port_a, 2 * MIB)
    out_of = send(hosts, "a", "b", port_b, 2 * MIB)
    assert into is not None and out_of is not None
    assert into[1] >= 0.5 and out_of[1] >= 0.5  # 2 MiB at 20 Mbit/s: ~0.84 s
    hosts.shape("a", None)
    hosts.shape("a", None)  # nothing to remove: fine
    free = send(hosts, "b", "a", port_a, 2 * MIB)
    assert free is not None and free[1] < 0.3
    with pytest.raises(ValueError):
        hosts.shape("a", 0)


def test_a_shaped_rack_uplink_slows_only_what_crosses_it(tmp_path: Path) -> None:
    """Hosts a, b in rack r1, c in r2: with r2's uplink at 20 Mbit/s, a -> b stays fast, a -> c
    and c -> a are slow; lifted, all are fast."""
    with HostSet(["a", "b", "c"], tmp_path, racks={"a": "r1", "b": "r1", "c": "r2"}) as hs:
        _, port_b = serve(hs, "b")
        _, port_c = serve(hs, "c")
        _, port_a = serve(hs, "a")
        hs.shape_rack("r2", 20)
        within, across, back = (send(hs, "a", "b", port_b, 2 * MIB),
                                send(hs, "a", "c", port_c, 2 * MIB),
                                send(hs, "c", "a", port_a, 2 * MIB))
        assert within is not None and across is not None and back is not None
        assert within[1] < 0.3 and across[1] >= 0.5 and back[1] >= 0.5  # ~0.84 s at 20 Mbit/s
        hs.shape_rack("r2", None)
        free = send(hs, "a", "c", port_c, 2 * MIB)
        assert free is not None and free[1] < 0.3
        with pytest.raises(HostError, match="no rack"):
            hs.shape_rack("r9", 10)
    with pytest.raises(ValueError, match="racks"):
        HostSet(["a"], tmp_path, racks={"z": "r1"})


def test_remove_stale_sweeps_dead_owners_only(hosts: HostSet) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(dead.pid, 0)
    stale, pool = f"rgh{dead.pid}-x", POOL_BASE / str(dead.pid)
    try:
        subprocess.run(["ip", "netns", "add", stale], check=True, capture_output=True)
        (pool / "x").mkdir(parents=True)
        inside = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "60"])
        deadline = time.monotonic() + 5.0
        while not subprocess.run(["ip", "netns", "pids", stale], capture_output=True,
                                 text=True).stdout.strip():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert remove_stale() == [stale]
        assert stale not in _netns() and not pool.exists()
        assert inside.wait(timeout=5) != 0  # killed
        assert {hosts["a"].netns, hosts["b"].netns, hosts.bridge_netns} <= set(_netns())
        assert Path(hosts["a"].pool_root).is_dir()
    finally:
        if stale in _netns():
            subprocess.run(["ip", "netns", "del", stale], check=False)
        subprocess.run(["rm", "-rf", str(pool)], check=False)


def test_pool_args_are_checked_for_the_launch_wrapper(tmp_path: Path) -> None:
    hs = HostSet(["a", "b"], tmp_path)
    py = sys.executable
    for wrapper in ([py, "-m", "radix_global_cli", "sglang"], ["radix-global", "sglang"],
                    [py, "-m", "sglang_patch.launch_server"]):
        hs.check_pool_args("a", [*wrapper, "--model-path", "m", *hs.pool_args("a")])
        hs.check_pool_args("a", [*wrapper, f"--radix-global-pool-root={hs['a'].pool_root}/",
                                 f"--radix-global-pool-id={hs['a'].pool_id}"])
        with pytest.raises(HostError, match="host b's"):
            hs.check_pool_args("a", [*wrapper, "--radix-global-pool-root", hs["b"].pool_root,
                                     "--radix-global-pool-id", hs["a"].pool_id])
        with pytest.raises(HostError, match="host b's"):
            hs.check_pool_args("a", [*wrapper, "--radix-global-pool-root", hs["a"].pool_root,
                                     f"--radix-global-pool-id={hs['b'].pool_id}"])
        with pytest.raises(HostError, match="without --radix-global-pool-root"):
            hs.check_pool_args("a", [*wrapper, "--radix-global-pool-id", hs["a"].pool_id])
        with pytest.raises(HostError, match="not this host's"):
            hs.check_pool_args("a", [*wrapper, "--radix-global-pool-root",
                                     "/dev/shm/radix-global",
                                     "--radix-global-pool-id", hs["a"].pool_id])
    hs.check_pool_args("a", [py, "-m", "radix_global_cli", "router", "--port", "1"])
    # spawn checks before starting
    with pytest.raises(HostError, match="without --radix-global-pool-id"):
        hs.spawn("a", "engine", ["radix-global", "sglang", "--radix-global-pool-root",
                                 hs["a"].pool_root])
    with pytest.raises(HostError, match="not up"):
        hs.spawn("a", "router", ["radix-global", "router"])
    assert not list(tmp_path.iterdir())  # nothing was started


def test_names_and_subnet_are_validated(tmp_path: Path) -> None:
    for names in (["a", "a"], ["A"], ["a-b"], ["br"], ["abcdefghijk"], [], [""]):
        with pytest.raises(ValueError):
            HostSet(names, tmp_path)
    for subnet in ("192.168.0", "10.77", "10.256.0", "10.77.0.0"):
        with pytest.raises(ValueError):
            HostSet(["a"], tmp_path, subnet=subnet)
    hs = HostSet(["a", "r2"], tmp_path, subnet="10.9.8")
    assert hs["r2"].address == "10.9.8.3" and hs["r2"].netns == f"rgh{os.getpid()}-r2"
    assert hs["a"].pool_id == f"shm-a-{os.getpid()}"
    with pytest.raises(HostError, match="no host"):
        hs["zz"]


def test_a_second_set_of_the_same_process_is_refused(hosts: HostSet, tmp_path: Path) -> None:
    with pytest.raises(HostError, match="is up"):
        HostSet(["a"], tmp_path / "other").up()
    assert {hosts["a"].netns, hosts.bridge_netns} <= set(_netns())  # the first one untouched


@pytest.mark.parametrize("fault", [HostError, KeyboardInterrupt])
def test_a_failed_or_interrupted_up_tears_down_what_it_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: type[BaseException]) -> None:
    real_ip = netns.ip

    def ip(*args: str) -> str:
        if "v-b" in args and "master" in args:
            if fault is KeyboardInterrupt:
                raise KeyboardInterrupt
            return real_ip(*args[:-1], "nosuchmode")  # a real refusal, with its stderr
        return real_ip(*args)

    monkeypatch.setattr(netns, "ip", ip)
    hs = HostSet(["a", "b"], tmp_path)
    with pytest.raises(fault) as caught:
        hs.up()
    if fault is HostError:
        assert "nosuchmode" in str(caught.value)
    assert not _ours() and not hs.pool_base.exists()
