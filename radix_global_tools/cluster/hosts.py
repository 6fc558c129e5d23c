"""Test hosts on one machine, each a Linux network namespace, joined by a bridge (or racks of them).

    with HostSet(["a", "b", "r"], run_dir) as hosts:
        hosts.spawn("a", "engine", [..., *hosts.pool_args("a")])
        hosts.fail("a")                          # the host dies: processes killed, cable out

Host ``x`` is namespace ``rgh<pid>-x``; its ``eth0`` (``<subnet>.<i+2>/24``) is the far end of
veth ``v-x``, enslaved to ``br0`` in namespace ``rgh<pid>-br``: the root namespace gets no
address, link or listener, hosts reach each other only through the bridge (where cables are
pulled and shaped). Namespaces share the filesystem, so each host has its own pool root and id
(``check_pool_args``). Spawned processes run in their own session, logs in ``run_dir``; waits
are bounded. ``close`` (also at exit, and by a failed or interrupted ``up``) kills everything in
the set's namespaces, deletes them and the pool roots; ``remove_stale`` (run by ``up``) sweeps
sets of dead owners. One HostSet per process at a time (the names carry the owner's pid).

Racks (``racks={"a": "r1", "b": "r1", "c": "r2"}``): a rack's hosts hang off its own bridge
``br-<rack>``, joined to ``br0`` by a veth pair (``up-<rack>`` on the rack's bridge, ``dn-<rack>``
on ``br0``): the rack's uplink, which :meth:`HostSet.shape_rack` limits. Hosts in no rack hang off
``br0`` (the core).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from radix_global_tools.cluster import netns
from radix_global_tools.cluster.netns import POOL_BASE, PREFIX, HostError
from sglang_patch.sem_sweep import semaphores, sweep_semaphores

BRIDGE = "br0"
SPAWN_TIMEOUT_S = 10.0
PORT_RANGE = (30100, 32000)  # below the kernel's ephemeral ports (32768+): no clash with clients
_NAME = re.compile(r"[a-z0-9]{1,10}")
_RACK = re.compile(r"[a-z0-9]{1,8}")
_WRAPPERS = ("radix_global_cli", "radix-global")


class LinkBytes(NamedTuple):
    """Bytes counted on the host's own interface (eth0) since the set came up."""

    rx: int
    tx: int


@dataclass(frozen=True)
class Host:
    name: str  # "a", "b", "r" ... (<= 10 chars, [a-z0-9])
    netns: str  # f"{PREFIX}{owner_pid}-{name}"
    address: str  # <subnet>.<i+2>, /24 on the host's eth0
    pool_root: str  # f"{POOL_BASE}/{owner_pid}/{name}": this host's own pool root
    pool_id: str  # f"shm-{name}-{owner_pid}"


class HostSet:
    """N hosts: one namespace each, joined by veth pairs to a bridge in a namespace of its own.

    Names: unique, ``[a-z0-9]{1,10}``, not ``br``; ``subnet``: ``10.x.y`` (hosts get ``.2`` up).
    Bad arguments raise ValueError; what the system or a check here refuses raises HostError."""

    def __init__(self, names: Sequence[str], run_dir: str | Path, subnet: str = "10.77.0",
                 stop_timeout_s: float = 5.0, racks: Mapping[str, str] | None = None) -> None:
        names = list(names)
        if (any(not _NAME.fullmatch(n) or n == "br" for n in names)
                or not 0 < len(set(names)) == len(names) <= 253):
            raise ValueError(f"host names {names}: 1..253 unique, [a-z0-9]{{1,10}}, not 'br'")
        self.racks = dict(racks or {})
        if not set(self.racks) <= set(names) or any(
                not _RACK.fullmatch(r) for r in self.racks.values()):
            raise ValueError(f"racks {self.racks}: hosts of this set, rack names [a-z0-9]{{1,8}}")
        m = re.fullmatch(r"10\.(\d{1,3})\.(\d{1,3})", subnet)
        if not m or any(int(octet) > 255 for octet in m.groups()):
            raise ValueError(f"subnet {subnet!r}: 10.x.y")
        pid = self.owner_pid = os.getpid()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.stop_timeout_s = stop_timeout_s
        self.bridge_netns = f"{PREFIX}{pid}-br"
        self.pool_base = POOL_BASE / str(pid)
        self.hosts: dict[str, Host] = {
            n: Host(n, f"{PREFIX}{pid}-{n}", f"{subnet}.{i + 2}", str(self.pool_base / n),
                    f"shm-{n}-{pid}") for i, n in enumerate(names)}
        # Only what this instance made is torn down: a refused up() must not delete the
        # namespaces of another set that has the same names.
        self._made: list[str] = []
        self._pools: list[Path] = []
        self._spawned: list[tuple[str, subprocess.Popen[bytes]]] = []  # (host, process)
        self._given: dict[str, set[int]] = {n: set() for n in names}  # ports handed out
        self._sems = semaphores()  # /dev/shm (shared by the hosts) before their processes

    def __enter__(self) -> HostSet:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise HostError(f"no host {name!r} in this set ({', '.join(self.hosts)})") from None

    def up(self) -> HostSet:
        """Create the bridge and the hosts (sets of dead owners are swept first). On a failure
        or an interrupt what was made is torn down; failures raise HostError."""
        netns.remove_stale(PREFIX)
        mine = {self.bridge_netns, *(h.netns for h in self.hosts.values())}
        taken = set(netns.netns_list()) & mine
        if taken:
            raise HostError(f"namespaces {sorted(taken)} exist: this set or another of this "
                            "process is up")
        atexit.register(self.close)
        try:
            br = self.bridge_netns
            self._add_netns(br)
            # No multicast snooping: the bridge would send IGMP reports to every host.
            netns.ip("-n", br, "link", "add", BRIDGE, "type", "bridge", "mcast_snooping", "0")
            netns.ip("-n", br, "link", "set", BRIDGE, "up")
            for rack in sorted(set(self.racks.values())):
                netns.ip("-n", br, "link", "add", f"br-{rack}", "type", "bridge",
                         "mcast_snooping", "0")
                netns.ip("-n", br, "link", "add", f"up-{rack}", "type", "veth", "peer", "name",
                         f"dn-{rack}")
                netns.ip("-n", br, "link", "set", f"up-{rack}", "master", f"br-{rack}", "up")
                netns.ip("-n", br, "link", "set", f"dn-{rack}", "master", BRIDGE, "up")
                netns.ip("-n", br, "link", "set", f"br-{rack}", "up")
            for h in self.hosts.values():
                self._add_netns(h.netns)
                # Made inside the bridge namespace: no end ever appears in the root one.
                netns.ip("-n", br, "link", "add", f"v-{h.name}", "type", "veth", "peer", "name",
                    "eth0", "netns", h.netns)
                switch = f"br-{self.racks[h.name]}" if h.name in self.racks else BRIDGE
                netns.ip("-n", br, "link", "set", f"v-{h.name}", "master", switch, "up")
                netns.ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
                netns.ip("-n", h.netns, "link", "set", "eth0", "up")
                self._pools.append(Path(h.pool_root))
                shutil.rmtree(h.pool_root, ignore_errors=True)  # a leftover: no live set has it
                Path(h.pool_root).mkdir(parents=True)
        except BaseException as e:
            self.close()
            if isinstance(e, HostError) or not isinstance(e, Exception):
                raise  # KeyboardInterrupt/SystemExit go on, after the teardown
            raise HostError(f"cannot make the host set: {e}") from e
        return self

    def _add_netns(self, ns: str) -> None:
        self._made.append(ns)  # before creating: an interrupt in between still tears it down
        netns.ip("netns", "add", ns)
        netns.ip("-n", ns, "link", "set", "lo", "up")
        # No IPv6 on interfaces made from now on (lo keeps it): its multicast chatter would
        # add to every host's byte counts.
        netns.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                   "net.ipv6.conf.default.disable_ipv6=1"])

    def close(self) -> None:
        """Kill every process of the set, delete its namespaces and pool roots. Idempotent, and
        safe in a ``finally`` after Ctrl-C: SIGINT/SIGTERM wait until it is done."""
        with _signals_held():
            for _, popen in self._spawned:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGKILL)
            for ns in self._made:
                netns.kill_netns(ns, self.stop_timeout_s)
            for _, popen in self._spawned:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=self.stop_timeout_s)
            sweep_semaphores(self._sems, groups=[popen.pid for _, popen in self._spawned])
            existing = set(netns.netns_list())
            for ns in reversed(self._made):  # hosts first, the bridge last
                if ns in existing:
                    with contextlib.suppress(HostError):
                        netns.ip("netns", "del", ns)
            for root in self._pools:
                shutil.rmtree(root, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.pool_base.rmdir()  # if empty
            self._made, self._pools, self._spawned = [], [], []
            atexit.unregister(self.close)

    def argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run in ``host`` (``ip netns exec`` execs it: same pid, same process group)."""
        return ["ip", "netns", "exec", self[host].netns, *argv]

    def log_path(self, host: str, name: str) -> Path:
        return self.run_dir / f"{host}-{name}.log"

    def spawn(self, host: str, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
              cores: set[int] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``host`` after ``check_pool_args``: own session, output to
        ``log_path`` (command line first), pinned to ``cores`` if given; ``close`` kills it.
        Returns once the process is in the host's namespace (or has already exited)."""
        self.check_pool_args(host, argv)
        if self[host].netns not in self._made:
            raise HostError(f"host {host!r} is not up")
        full = self.argv(host, argv)
        with open(self.log_path(host, name), "ab") as out:
            out.write(("$ " + shlex.join(full) + "\n").encode())
            out.flush()
            popen = subprocess.Popen(
                full, stdout=out, stderr=subprocess.STDOUT,
                env=env or dict(os.environ), start_new_session=True,
                preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores))
        self._spawned.append((host, popen))
        # `ip netns exec` enters the namespace after the fork: until then `fail` would not see
        # (nor kill) the process (a CI run listed no pid right after the spawn).
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while popen.pid not in self.pids(host) and popen.poll() is None:
            if time.monotonic() > deadline:
                raise HostError(f"host {host}: {name} did not enter it in {SPAWN_TIMEOUT_S} s")
            time.sleep(0.01)
        return popen

    def pool_args(self, host: str) -> list[str]:
        return ["--radix-global-pool-root", self[host].pool_root,
                "--radix-global-pool-id", self[host].pool_id]

    def check_pool_args(self, host: str, argv: Sequence[str]) -> None:
        """A launch-wrapper command line (``sglang_patch.launch_server``, ``radix_global_cli
        sglang``, ``radix-global sglang``) must carry this host's ``--radix-global-pool-root``
        and ``--radix-global-pool-id`` (``--flag v`` or ``--flag=v``, every occurrence): a
        shared pool would let KV cross hosts without the network. Other command lines pass.
        Refusals raise HostError."""
        me = self[host]
        if not _is_launch_wrapper(argv) or any(v.startswith("mooncake://")
                                               for v in _flag_values(argv, "--radix-global-pool")):
            return  # a Mooncake pool is shared over the network by design
        for flag, want in (("--radix-global-pool-root", me.pool_root),
                           ("--radix-global-pool-id", me.pool_id)):
            values = _flag_values(argv, flag)
            if not values:
                raise HostError(f"host {host}: launch wrapper without {flag} (the default is "
                                f"shared by all hosts; pass {shlex.join(self.pool_args(host))})")
            for v in values:
                if (os.path.normpath(v) if flag == "--radix-global-pool-root" else v) == want:
                    continue
                owner = next((h.name for h in self.hosts.values() if h is not me and (
                    v == h.pool_id if flag == "--radix-global-pool-id"
                    else Path(os.path.normpath(v)).is_relative_to(h.pool_root))), None)
                whose = f"host {owner}'s" if owner else "not this host's"
                raise HostError(f"host {host}: {flag} {v} is {whose} (want {want})")

    def link(self, host: str, up: bool) -> None:
        """Plug (``up``) or pull the host's cable: its veth end on the bridge."""
        netns.ip("-n", self.bridge_netns, "link", "set", f"v-{self[host].name}",
            "up" if up else "down")

    def shape(self, host: str, rate_mbit: float | None) -> None:
        """Limit the host's cable to ``rate_mbit`` each way (tbf: bandwidth only, no delay;
        netem is not in this kernel); None lifts the limit."""
        h = self[host]
        # The bridge side shapes what the host receives, eth0 what it sends.
        _shape([(self.bridge_netns, f"v-{h.name}"), (h.netns, "eth0")], rate_mbit)

    def shape_rack(self, rack: str, rate_mbit: float | None) -> None:
        """Limit ``rack``'s uplink to ``rate_mbit`` each way; None lifts the limit."""
        if rack not in self.racks.values():
            raise HostError(f"no rack {rack!r} in this set ({sorted(set(self.racks.values()))})")
        # dn- sends into the rack, up- out of it
        _shape([(self.bridge_netns, f"up-{rack}"), (self.bridge_netns, f"dn-{rack}")], rate_mbit)

    def bytes(self, host: str) -> LinkBytes:
        stats = json.loads(netns.ip("-n", self[host].netns, "-s", "-j", "link", "show", "eth0"))
        s64 = stats[0]["stats64"]
        return LinkBytes(int(s64["rx"]["bytes"]), int(s64["tx"]["bytes"]))

    def pids(self, host: str) -> list[int]:
        return [int(p) for p in netns.ip("netns", "pids", self[host].netns).split()]

    def fail(self, host: str) -> None:
        """The host dies: its cable pulled first (so no FIN or RST of its dying processes
        reaches anyone, as with a power loss), then everything in it SIGKILLed and reaped
        (bounded). Processes still there after ``stop_timeout_s`` raise HostError."""
        self.link(host, False)
        left = netns.kill_netns(self[host].netns, self.stop_timeout_s)
        for _, popen in (s for s in self._spawned if s[0] == host):
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=self.stop_timeout_s)
        self._spawned = [s for s in self._spawned if s[0] != host]
        if left:
            raise HostError(f"host {host}: pids {left} survived SIGKILL")

    def restore(self, host: str) -> None:
        """The cable back in; the host's processes are the caller's to restart."""
        self.link(host, True)

    def url(self, host: str, port: int) -> str:
        return f"http://{self[host].address}:{port}"

    def free_port(self, host: str) -> int:
        """A port in ``PORT_RANGE`` no TCP/UDP socket listens on inside ``host``, never handed
        out before by this set (processes started together get different ones)."""
        out = netns.run(["ss", "-N", self[host].netns, "-Hltun"])  # lines end "local:port peer"
        used = {int(p) for p in re.findall(r":(\d+)\s+\S+\s*$", out, re.MULTILINE)}
        free = sorted(set(range(*PORT_RANGE)) - used - self._given[host])
        if not free:
            raise HostError(f"host {host}: no free port in {PORT_RANGE}")
        port = random.choice(free)
        self._given[host].add(port)
        return port


def _shape(devices: Sequence[tuple[str, str]], rate_mbit: float | None) -> None:
    """A tbf of ``rate_mbit`` on what each (namespace, device) sends; None removes it."""
    if rate_mbit is not None and not rate_mbit > 0:
        raise ValueError(f"rate {rate_mbit} Mbit/s: must be > 0")
    for ns, dev in devices:
        if rate_mbit is not None:
            netns.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                       f"{max(1, round(rate_mbit * 1000))}kbit", "burst", "64kb",
                       "latency", "400ms"])
            continue
        shown = json.loads(netns.run(["tc", "-n", ns, "-j", "qdisc", "show", "dev", dev]))
        if any(q.get("kind") == "tbf" for q in shown):  # del refuses the default qdisc
            netns.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"])


def _is_launch_wrapper(argv: Sequence[str]) -> bool:
    return any("sglang_patch.launch_server" in a
               or (os.path.basename(a) in _WRAPPERS and list(argv[i + 1:i + 2]) == ["sglang"])
               for i, a in enumerate(argv))


def _flag_values(argv: Sequence[str], flag: str) -> list[str]:
    """Every value of ``flag`` in ``argv``, as ``flag v`` or ``flag=v``."""
    return [argv[i + 1] if a == flag and i + 1 < len(argv) else a.partition("=")[2]
            for i, a in enumerate(argv) if a == flag or a.startswith(flag + "=")]


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    # A second Ctrl-C during a teardown would strand namespaces: SIGINT/SIGTERM stay pending
    # until it is done, then act as usual.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
