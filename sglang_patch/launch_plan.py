"""Pure part of ``radix-global sglang``: our flags + the user's SGLang flags -> SGLang's argv.

Our flags (everything else is passed to ``sglang.launch_server`` unchanged):

``--radix-global URL``       router/index to join (omit: standalone worker with the pool only)
``--advertise-host ADDR``    the address other hosts reach this worker at (default ``--host``
                             unless it is a wildcard, which then needs this flag): the event
                             endpoints bind it and the registration names it
``--event-port-base PORT``   fixed ports for a firewall: KV events PORT (+ dp rank), replay
                             PORT + dp size (+ rank), pool events PORT + 2 x dp size (default:
                             free ports of 30100-32767)
``--worker-id ID``           default ``sgl-<advertise host>-<port>``
``--admin-token TOKEN``      default env ``RADIX_GLOBAL_ADMIN_TOKEN``
``--role mixed|prefill|decode``  registered role. With ``--disaggregation-mode prefill|decode`` it
                             must agree with it (SGLang's native PD). Without one, ``prefill`` /
                             ``decode`` is a *pool hand-off* worker (``docs/pd.md``): an ordinary
                             SGLang server registered in that role; a decode one gets
                             ``--hicache-storage-prefetch-policy wait_complete`` and a one-page
                             L3 ``prefetch_threshold`` unless the user set them
``--namespace NS``           default ``<served model>@<config.json hash>``
``--pool shm|mooncake://MASTER:PORT``  the L3 pool: this machine's shared memory (default), or
                             a Mooncake Store shared by every host (``sglang_patch/pool/
                             mooncake_pool.py``; this worker contributes ``--pool-capacity-gb``
                             of its memory as a segment)
``--pool-id ID``             default ``shm-<hostname>``; for a Mooncake pool this worker's
                             segment ``mooncake-<master>-<port>@<advertise host>:<port>``;
                             ``--pool-capacity-gb``, ``--pool-root`` (shm only)
``--pool-disk DIR``          a persistent tier under the pool: every page is written through to
                             DIR and survives reboots (``--pool-disk-gb``, default 10;
                             ``docs/interfaces.md`` s. 16)
``--pool-load-probe-tokens N``  measure the engine's load path from the pool with a prompt of N
                             tokens before registering (``sglang_patch/load_probe.py``; 512 is
                             a good length; default 0: off)
``--heartbeat-interval S``   default 5

What we add: HiCache with write-through to our L3 backend (``--enable-hierarchical-cache
--hicache-write-policy write_through --hicache-storage-backend dynamic
--hicache-storage-backend-extra-config {...}``), KV events (``--kv-events-config`` with a ZMQ
publisher and replay socket on the advertised address), the router's URL for the backend's
shared-prefix aliases (``docs/interfaces.md`` s. 15), and on ``--device cpu`` the HiCache
settings that work there (``--hicache-io-backend direct --hicache-mem-layout layer_first``).
A user flag that contradicts one of these is a :class:`LaunchError` naming it; a compatible one
is kept.
"""

from __future__ import annotations

import argparse
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from radix_global.pool_ids import is_segment, segment_pool_id
from radix_global.types import Role
from sglang_patch.pool.mooncake_pool import MIN_SEGMENT_BYTES
from sglang_patch.ports import free_port

BACKEND = {"backend_name": "radix_global_pool", "module_path": "sglang_patch.storage",
           "class_name": "RadixGlobalPoolStorage", "interface_v1": 1,
           "hicache_storage_pass_prefix_keys": True}
ROLE_OF_MODE = {None: Role.MIXED, "null": Role.MIXED, "prefill": Role.PREFILL,
                "decode": Role.DECODE}


class LaunchError(ValueError):
    """An impossible or contradictory combination of flags, explained."""


@dataclass(frozen=True)
class OurFlags:
    radix_global: str | None
    advertise_host: str | None
    event_port_base: int | None
    worker_id: str | None
    admin_token: str | None
    role: Role | None
    namespace: str | None
    pool: str
    pool_id: str | None  # None: default_pool_id (it needs the advertised address)
    pool_capacity_gb: float
    pool_root: str | None
    pool_disk: str | None
    pool_disk_gb: float
    heartbeat_interval: float
    # Off by default: seconds of start-up and 512 tokens of pool room (s. 2)
    pool_load_probe_tokens: int = 0


@dataclass(frozen=True)
class LaunchPlan:
    """What to run and what to register."""

    sglang_argv: list[str]  # arguments for ``python -m sglang.launch_server``
    flags: OurFlags
    device: str
    host: str  # what the HTTP server binds (--host)
    advertise_host: str  # what other hosts connect to
    port: int
    role: Role
    model_path: str
    kv_events_endpoint: str | None
    kv_events_replay_endpoint: str | None
    pool_events_endpoint: str | None
    backend_config: dict[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The HTTP base URL other hosts (and the supervisor) reach the server at."""
        return f"http://{host_port(self.advertise_host, self.port)}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radix-global sglang", add_help=False,
                                description="SGLang server that joins radix-global")
    p.add_argument("--radix-global", default=None, metavar="URL",
                   help="router/index to register with (omit: standalone, pool only)")
    p.add_argument("--advertise-host", default=None, metavar="ADDR",
                   help="address other hosts reach this worker at (default: --host unless "
                        "it is a wildcard such as 0.0.0.0, which then needs this flag)")
    p.add_argument("--event-port-base", type=int, default=None, metavar="PORT",
                   help="KV events on PORT (+ dp rank), replay on PORT + dp size, pool events "
                        "on PORT + 2 x dp size (default: free ports)")
    p.add_argument("--worker-id", default=None, help="default sgl-<advertise host>-<port>")
    p.add_argument("--admin-token", default=None, help="default $RADIX_GLOBAL_ADMIN_TOKEN")
    p.add_argument("--role", choices=[r.value for r in Role], default=None,
                   help="registered role; must match --disaggregation-mode if that is given; "
                        "without it, prefill/decode = pool hand-off worker (docs/pd.md)")
    p.add_argument("--namespace", default=None,
                   help="default <served model>@<config.json hash>")
    p.add_argument("--pool", default="shm", metavar="shm|mooncake://MASTER:PORT",
                   help="L3 pool: this machine's shared memory, or a Mooncake Store")
    p.add_argument("--pool-id", default=None,
                   help="L3 pool id (default shm-<hostname>; for Mooncake this worker's segment "
                        "mooncake-<master>-<port>@<advertised host>:<port>)")
    p.add_argument("--pool-capacity-gb", type=float, default=1.0,
                   help="pool size (the first process to open it decides)")
    p.add_argument("--pool-root", default=None, help="default /dev/shm/radix-global")
    p.add_argument("--pool-disk", default=None,
                   help="a folder: the pool's persistent tier (write-through)")
    p.add_argument("--pool-disk-gb", type=float, default=10.0)
    p.add_argument("--heartbeat-interval", type=float, default=5.0, help="seconds")
    p.add_argument("--pool-load-probe-tokens", type=int, default=OurFlags.pool_load_probe_tokens,
                   metavar="N", help="prompt length of the start-up probe of the engine's load "
                                     "path from the pool (0: off)")
    return p


def flag_value(argv: Sequence[str], name: str) -> str | None:
    """Value of ``--name V`` / ``--name=V`` in an SGLang command line (last one wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*", "[::]"})


def host_port(host: str, port: int) -> str:
    """``host:port`` for a URL or a ZMQ tcp endpoint (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def advertised_host(host: str | None, advertise: str | None) -> str:
    """The address the worker is reached at: ``advertise`` or else ``host`` (SGLang's default
    127.0.0.1). A wildcard ``host`` names no address to reach, and a specific ``host`` other than
    ``advertise`` would not be listening there: both are a :class:`LaunchError`."""
    bind = host or "127.0.0.1"
    if advertise is None:
        if bind in WILDCARD_HOSTS:
            raise LaunchError(f"--host {bind} listens on every interface but names none to "
                              "register: add --advertise-host ADDR (the address other hosts "
                              "reach this one at)")
        advertise = bind
    if not advertise or advertise in WILDCARD_HOSTS or not advertise.isprintable():
        raise LaunchError(f"--advertise-host {advertise!r} is not an address to connect to")
    if ":" in advertise:
        raise LaunchError(f"{advertise}: IPv6 is not supported (SGLang's KV-event publisher "
                          "does not enable ZMQ's IPv6 sockets); advertise an IPv4 address or a "
                          "name")
    if bind not in WILDCARD_HOSTS and bind != advertise:
        raise LaunchError(f"--advertise-host {advertise} but --host {bind}: the server would "
                          f"not listen at the advertised address; use --host {advertise} or "
                          "--host 0.0.0.0")
    return advertise


def has_flag(argv: Sequence[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in argv)


def _without(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def build_plan(argv: Sequence[str], ports: Sequence[int] | None = None,
               default_namespace: str | None = None) -> LaunchPlan:
    """Split ``argv`` into ours and SGLang's, check them, and add the flags that join the cluster.
    ``ports`` (kv events, replay, pool events) default to ports free on the advertised address
    (``--advertise-host``, else ``--host``), which the endpoints bind; the namespace is
    ``--namespace`` or else ``default_namespace`` (the caller hashes the model folder)."""
    ours_ns, rest = parser().parse_known_args(list(argv))
    ours = OurFlags(ours_ns.radix_global, ours_ns.advertise_host, ours_ns.event_port_base,
                    ours_ns.worker_id,
                    ours_ns.admin_token,
                    Role(ours_ns.role) if ours_ns.role else None, ours_ns.namespace,
                    ours_ns.pool, ours_ns.pool_id,
                    ours_ns.pool_capacity_gb, ours_ns.pool_root,
                    ours_ns.pool_disk, ours_ns.pool_disk_gb,
                    ours_ns.heartbeat_interval, ours_ns.pool_load_probe_tokens)
    model_path = flag_value(rest, "--model-path") or flag_value(rest, "--model")
    if not model_path:
        raise LaunchError("--model-path is required")
    mode = flag_value(rest, "--disaggregation-mode")
    if mode not in ROLE_OF_MODE:
        raise LaunchError(f"unknown --disaggregation-mode {mode!r}")
    role = registered_role(ours.role, mode)
    _refuse_conflicts(rest)
    device = flag_value(rest, "--device") or "cuda"
    host = flag_value(rest, "--host") or "127.0.0.1"
    advertise = advertised_host(host, ours.advertise_host)
    bind = advertise.strip("[]")
    try:
        kv_port, replay_port, pool_port = ports or event_ports(ours.event_port_base, rest, bind)
    except OSError as exc:
        raise LaunchError(f"cannot bind the event endpoints on {advertise}: {exc} (is it an "
                          "address of this host?)") from exc
    kv_ep = replay_ep = None
    args = list(rest)
    if ours.radix_global:
        kv_ep = f"tcp://{host_port(advertise, kv_port)}"
        replay_ep = f"tcp://{host_port(advertise, replay_port)}"
        args += ["--kv-events-config", json.dumps({
            "publisher": "zmq", "endpoint": kv_ep, "bind": True, "topic": "kv-events",
            "replay_endpoint": replay_ep})]
    pool_ep = f"tcp://{host_port(advertise, pool_port)}" if ours.radix_global else None
    backend: dict[str, object] = dict(BACKEND)
    user_extra = flag_value(rest, "--hicache-storage-backend-extra-config")
    if user_extra:
        try:
            backend = {**json.loads(user_extra), **BACKEND}
        except json.JSONDecodeError as exc:
            raise LaunchError(f"--hicache-storage-backend-extra-config is not JSON: {exc}") from exc
        args = _without(args, "--hicache-storage-backend-extra-config")
    port = int(flag_value(rest, "--port") or 30000)
    ours = replace(ours, pool_id=ours.pool_id or default_pool_id(ours.pool, advertise, port))
    _check_pool(ours)
    backend.update({"pool_id": ours.pool_id,
                    "pool_capacity_bytes": int(ours.pool_capacity_gb * (1 << 30))})
    master = mooncake_master(ours.pool)
    if master is not None:
        backend.update({"pool": "mooncake", "mooncake_master": master,
                        "mooncake_local_hostname": advertise})
    if ours.pool_root:
        backend["pool_root"] = ours.pool_root
    if ours.pool_disk:
        backend.update({"pool_disk": ours.pool_disk,
                        "pool_disk_capacity_bytes": int(ours.pool_disk_gb * (1 << 30))})
    if ours.namespace or default_namespace:
        backend["namespace"] = ours.namespace or default_namespace
    if pool_ep:
        backend["pool_events_endpoint"] = pool_ep
    if ours.radix_global:  # the router answers the backend's shared-prefix alias questions
        backend["pool_aliases_url"] = ours.radix_global
    pool_decode = role is Role.DECODE and ROLE_OF_MODE[mode] is Role.MIXED
    if pool_decode:
        # The prompt must come from the pool, not be recomputed: wait for the prefetch, and do
        # not skip prefetches shorter than SGLang's 256-token default threshold.
        backend.setdefault("prefetch_threshold", int(flag_value(rest, "--page-size") or 1))
        if not has_flag(args, "--hicache-storage-prefetch-policy"):
            args += ["--hicache-storage-prefetch-policy", "wait_complete"]
    if not has_flag(args, "--enable-hierarchical-cache"):
        args.append("--enable-hierarchical-cache")
    if mode == "decode" and not has_flag(args, "--disaggregation-decode-enable-radix-cache"):
        # SGLang disables the radix cache on decode workers, and HiCache sits under it.
        args.append("--disaggregation-decode-enable-radix-cache")
    if not has_flag(args, "--hicache-write-policy"):
        args += ["--hicache-write-policy", "write_through"]
    if device == "cpu":
        if not has_flag(args, "--hicache-io-backend"):
            args += ["--hicache-io-backend", "direct"]
        if not has_flag(args, "--hicache-mem-layout"):
            args += ["--hicache-mem-layout", "layer_first"]
    args += ["--hicache-storage-backend", "dynamic"]
    args += ["--hicache-storage-backend-extra-config", json.dumps(backend)]
    return LaunchPlan(args, ours, device, host, advertise, port, role, model_path, kv_ep,
                      replay_ep, pool_ep, backend)


MOONCAKE_SCHEME = "mooncake://"


def mooncake_master(pool: str) -> str | None:
    """``HOST:PORT`` of a ``mooncake://HOST:PORT`` pool; None for ``shm``; else LaunchError."""
    if pool == "shm":
        return None
    master = pool.removeprefix(MOONCAKE_SCHEME)
    host, sep, port = master.rpartition(":")
    if not pool.startswith(MOONCAKE_SCHEME) or not sep or not host or not port.isdigit():
        raise LaunchError(f"--pool {pool!r}: shm or mooncake://MASTER_HOST:PORT")
    return master


def default_pool_id(pool: str, advertise: str, port: int) -> str:
    """``shm-<hostname>``; for a Mooncake Store, this worker's segment of it,
    ``mooncake-<master host>-<port>@<advertised address>:<server port>`` (one per worker: two
    workers of a host are two clients with two segments; ``radix_global/pool_ids.py``)."""
    master = mooncake_master(pool)
    if master is None:
        return f"shm-{socket.gethostname()}"
    return segment_pool_id("mooncake-" + master.replace(":", "-"), f"{advertise}:{port}")


def event_ports(base: int | None, sglang_argv: Sequence[str], bind: str) -> tuple[int, int, int]:
    """KV-event, replay and pool-event ports: from ``base`` in blocks of one port per dp rank
    (the subscriber connects rank ``r`` at port + ``r``), else free ports on ``bind``."""
    if base is None:
        return free_port(bind), free_port(bind), free_port(bind)
    # events carry the attention-DP rank when DP attention is on, the DP rank otherwise
    dp = max(int(flag_value(sglang_argv, name) or 1)
             for name in ("--dp-size", "--dp", "--attn-dp-size"))
    if not 1 <= base <= 65535 - 2 * dp:
        raise LaunchError(f"--event-port-base {base}: needs ports {base}..{base + 2 * dp}, "
                          "within 1..65535")
    http = int(flag_value(sglang_argv, "--port") or 30000)
    if base <= http <= base + 2 * dp:
        raise LaunchError(f"--event-port-base {base}: ports {base}..{base + 2 * dp} include "
                          f"the server's --port {http}")
    return base, base + dp, base + 2 * dp


def _check_pool(ours: OurFlags) -> None:
    """A pool id names a segment of a shared store exactly when it has an ``@``: an shm pool's
    must not (its entries would leave the index with the first worker); a Mooncake segment must
    hold Mooncake's smallest segment."""
    mooncake = mooncake_master(ours.pool) is not None
    if ours.pool_disk and mooncake:
        raise LaunchError("--pool-disk is a tier under this machine's shm pool; a Mooncake "
                          "Store persists with its own SSD offload")
    if ours.pool_load_probe_tokens < 0:
        raise LaunchError(f"--pool-load-probe-tokens {ours.pool_load_probe_tokens}: must be "
                          ">= 0 (0: no probe)")
    if ours.pool_disk and ours.pool_disk_gb <= 0:
        raise LaunchError(f"--pool-disk-gb {ours.pool_disk_gb}: must be > 0")
    if not mooncake and ours.pool_id is not None and is_segment(ours.pool_id):
        raise LaunchError(f"--pool-id {ours.pool_id}: '@' marks a segment of a shared store "
                          "(--pool mooncake://...); an shm pool id may not contain it")
    if mooncake and ours.pool_capacity_gb * (1 << 30) < MIN_SEGMENT_BYTES:
        raise LaunchError(f"--pool-capacity-gb {ours.pool_capacity_gb}: a Mooncake segment "
                          f"needs at least {MIN_SEGMENT_BYTES >> 20} MiB")
    if mooncake and ours.pool_root is not None:
        raise LaunchError("--pool-root is for the shm pool; a Mooncake pool has no root")


def registered_role(role: Role | None, mode: str | None) -> Role:
    """The role to register. A given ``--disaggregation-mode`` decides (native PD) and a
    different ``--role`` is refused; without one, ``--role`` (default mixed) is registered as is:
    prefill/decode then means the pool hand-off, where SGLang itself runs a normal server."""
    native = ROLE_OF_MODE[mode]
    if native is not Role.MIXED or role is None:
        if role is not None and role != native:
            raise LaunchError(f"--role {role.value} contradicts --disaggregation-mode "
                              f"{mode} (role {native.value}); drop one")
        return native
    return role


def _refuse_conflicts(rest: Sequence[str]) -> None:
    backend = flag_value(rest, "--hicache-storage-backend")
    if backend == "mooncake":
        # SGLang's own Mooncake backend refuses the layer_first host layout (the only CPU one)
        # and publishes no events: the index could never see its pages, on CPU or GPU.
        raise LaunchError("--hicache-storage-backend mooncake: use --pool mooncake://MASTER:PORT "
                          "(radix-global's backend over Mooncake Store: SGLang's own does not run "
                          "on CPU and tells the index nothing)")
    if backend is not None and backend != "dynamic":
        raise LaunchError(f"--hicache-storage-backend {backend}: radix-global provides the L3 "
                          "backend (its shared pool); remove the flag")
    if has_flag(rest, "--kv-events-config"):
        raise LaunchError("--kv-events-config: radix-global configures the KV-event publisher "
                          "itself (ZMQ on the advertised address, replay socket); remove the flag")
    policy = flag_value(rest, "--hicache-write-policy")
    if policy is not None and policy != "write_through":
        raise LaunchError(f"--hicache-write-policy {policy}: the global cache needs "
                          "write_through, so that every computed page reaches the shared pool")
    if has_flag(rest, "--disable-radix-cache"):
        raise LaunchError("--disable-radix-cache: the global cache needs SGLang's radix cache "
                          "(HiCache and the L3 pool sit under it)")
    device = flag_value(rest, "--device")
    io = flag_value(rest, "--hicache-io-backend")
    if device == "cpu" and io not in (None, "direct"):
        raise LaunchError(f"--hicache-io-backend {io} has no CPU implementation; use direct")
    layout = flag_value(rest, "--hicache-mem-layout")
    if device == "cpu" and layout not in (None, "layer_first"):
        raise LaunchError(f"--hicache-mem-layout {layout} is not supported on CPU "
                          "(only layer_first has a CPU transfer path)")
