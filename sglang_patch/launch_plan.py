"""Pure part of ``radix-global sglang``: our flags + the user's SGLang flags -> SGLang's argv.

The flags are read by :mod:`sglang_patch.launch_args` (ours: :class:`OurFlags`,
``--radix-global URL`` and ``--radix-global-<name>``; SGLang's: by SGLang's own parser), and
this module plans from the parsed values. In short (``radix-global sglang --help`` for all):

``--radix-global URL``               router/index to join (omit: a standalone worker, pool only)
``--radix-global-advertise-host``    the address other hosts reach this worker at (default
                                     ``--host`` unless it is a wildcard, which then needs it)
``--radix-global-event-port-base``   fixed event ports for a firewall (default: free ports)
``--radix-global-role``              mixed|prefill|decode. With ``--disaggregation-mode`` it must
                                     agree with it (SGLang's native PD). Without one,
                                     ``prefill`` / ``decode`` is a *pool hand-off* worker
                                     (``docs/pd.md``): an ordinary SGLang server registered in
                                     that role; a decode one gets ``--hicache-storage-prefetch-
                                     policy wait_complete`` and a one-page L3
                                     ``prefetch_threshold`` unless the user set them
``--radix-global-pool``              shm (default) or mooncake://MASTER:PORT (``sglang_patch/pool/
                                     mooncake_pool.py``); ``-pool-id``, ``-pool-capacity-gb``,
                                     ``-pool-root`` (shm only), ``-pool-disk`` (a persistent tier,
                                     ``docs/interfaces.md``, "The persistent disk tier under
                                     the pool"), ``-pool-load-probe-tokens``

What we add to SGLang's argv as the user wrote it: HiCache with write-through to our L3 backend
(``--enable-hierarchical-cache --hicache-write-policy write_through --hicache-storage-backend
dynamic --hicache-storage-backend-extra-config {...}``; a user's extra config is merged into ours
and ours comes last, so SGLang reads it), KV events (``--kv-events-config`` with a ZMQ publisher
and replay socket on the advertised address), the router's URL for the backend's shared-prefix
aliases (``docs/interfaces.md``, "Shared platform prefixes across isolated tenants"), and on
``--device cpu`` the HiCache settings that work there
(``--hicache-io-backend direct --hicache-mem-layout layer_first``). A user flag that contradicts one
of these is a :class:`LaunchError` naming it; a compatible one is kept.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from radix_global.pool_ids import is_segment, segment_pool_id
from radix_global.types import Role
from sglang_patch.launch_args import (
    LaunchArgs,
    LaunchError,
    OurFlags,
    SglangArgs,
    flag_of,
    parse_argv,
)
from sglang_patch.pool.mooncake_pool import MIN_SEGMENT_BYTES
from sglang_patch.ports import free_port

__all__ = ["LaunchError", "LaunchPlan", "OurFlags", "build_plan", "plan_launch"]

BACKEND = {"backend_name": "radix_global_pool", "module_path": "sglang_patch.storage",
           "class_name": "RadixGlobalPoolStorage", "interface_v1": 1,
           "hicache_storage_pass_prefix_keys": True}
ROLE_OF_MODE = {None: Role.MIXED, "null": Role.MIXED, "prefill": Role.PREFILL,
                "decode": Role.DECODE}
ADVERTISE = flag_of("advertise_host")
EVENT_PORT_BASE = flag_of("event_port_base")
POOL, POOL_ID = flag_of("pool"), flag_of("pool_id")


@dataclass(frozen=True)
class LaunchPlan:
    """What to run and what to register."""

    sglang_argv: list[str]  # arguments for ``python -m sglang.launch_server``
    flags: OurFlags
    sglang: SglangArgs  # the user's SGLang arguments, parsed
    advertise_host: str  # what other hosts connect to
    role: Role
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    pool_events_endpoint: str | None = None
    backend_config: dict[str, object] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return str(self.sglang["device"] or "cuda")

    @property
    def host(self) -> str:
        """What the HTTP server binds (``--host``)."""
        return str(self.sglang["host"] or "127.0.0.1")

    @property
    def port(self) -> int:
        return int(self.sglang["port"] or 30000)

    @property
    def model_path(self) -> str:
        return str(self.sglang["model_path"])

    @property
    def mode(self) -> str | None:
        """SGLang's ``--disaggregation-mode`` (``null``: none)."""
        mode = self.sglang["disaggregation_mode"]
        return None if mode is None else str(mode)

    @property
    def url(self) -> str:
        """The HTTP base URL other hosts (and the supervisor) reach the server at."""
        return f"http://{host_port(self.advertise_host, self.port)}"


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
                              f"register: add {ADVERTISE} ADDR (the address other hosts "
                              "reach this one at)")
        advertise = bind
    if not advertise or advertise in WILDCARD_HOSTS or not advertise.isprintable():
        raise LaunchError(f"{ADVERTISE} {advertise!r} is not an address to connect to")
    if ":" in advertise:
        raise LaunchError(f"{advertise}: IPv6 is not supported (SGLang's KV-event publisher "
                          "does not enable ZMQ's IPv6 sockets); advertise an IPv4 address or a "
                          "name")
    if bind not in WILDCARD_HOSTS and bind != advertise:
        raise LaunchError(f"{ADVERTISE} {advertise} but --host {bind}: the server would "
                          f"not listen at the advertised address; use --host {advertise} or "
                          "--host 0.0.0.0")
    return advertise


def build_plan(argv: Sequence[str], ports: Sequence[int] | None = None,
               default_namespace: str | None = None,
               environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """:func:`plan_launch` of ``argv`` (ours and SGLang's, :func:`parse_argv`)."""
    return plan_launch(parse_argv(argv, environ), ports, default_namespace)


def plan_launch(args: LaunchArgs, ports: Sequence[int] | None = None,
                default_namespace: str | None = None) -> LaunchPlan:
    """Check our flags and SGLang's, and add the flags that join the cluster. ``ports`` (kv
    events, replay, pool events) default to ports free on the advertised address (which the
    endpoints bind); the namespace is ours or else ``default_namespace`` (the caller hashes the
    model folder)."""
    ours, sg = args.flags, args.sglang
    mode = sg["disaggregation_mode"]
    role = registered_role(Role(ours.role) if ours.role else None, mode)
    _refuse_conflicts(sg)
    device = sg["device"] or "cuda"
    advertise = advertised_host(sg["host"], ours.advertise_host)
    bind = advertise.strip("[]")
    try:
        kv_port, replay_port, pool_port = ports or event_ports(ours.event_port_base, sg, bind)
    except OSError as exc:
        raise LaunchError(f"cannot bind the event endpoints on {advertise}: {exc} (is it an "
                          "address of this host?)") from exc
    kv_ep = replay_ep = pool_ep = None
    argv = list(sg.argv)
    if ours.radix_global:
        kv_ep = f"tcp://{host_port(advertise, kv_port)}"
        replay_ep = f"tcp://{host_port(advertise, replay_port)}"
        pool_ep = f"tcp://{host_port(advertise, pool_port)}"
        argv += ["--kv-events-config", json.dumps({
            "publisher": "zmq", "endpoint": kv_ep, "bind": True, "topic": "kv-events",
            "replay_endpoint": replay_ep})]
    backend: dict[str, object] = dict(BACKEND)
    user_extra = sg["hicache_storage_backend_extra_config"]
    if user_extra:  # merged; ours comes last on the command line, which SGLang reads
        try:
            backend = {**json.loads(user_extra), **BACKEND}
        except json.JSONDecodeError as exc:
            raise LaunchError(f"--hicache-storage-backend-extra-config is not JSON: {exc}") from exc
    port = int(sg["port"] or 30000)
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
        # and is told how long its loads took (docs/interfaces.md, "Where hosts are"), and a
        # segment of a shared store asks it for copies to make
        backend["pool_loads_url"] = ours.radix_global
        if backend.get("pool") == "mooncake":
            backend["pool_copies_url"] = ours.radix_global
    if role is Role.DECODE and ROLE_OF_MODE[mode] is Role.MIXED:  # a pool hand-off decode
        # The prompt must come from the pool, not be recomputed: wait for the prefetch, and do
        # not skip prefetches shorter than SGLang's 256-token default threshold.
        backend.setdefault("prefetch_threshold", int(sg["page_size"] or 1))
        if not sg.has("hicache_storage_prefetch_policy"):
            argv += ["--hicache-storage-prefetch-policy", "wait_complete"]
    if not sg.has("enable_hierarchical_cache"):
        argv.append("--enable-hierarchical-cache")
    if not sg.has("enable_cache_report"):
        # OpenAI answers then carry usage.prompt_tokens_details.cached_tokens: what clients
        # read of the cache, and what the router books as delivered (docs/interfaces.md,
        # "What the cache is worth, live")
        argv.append("--enable-cache-report")
    if mode == "decode" and not sg.has("disaggregation_decode_enable_radix_cache"):
        # SGLang disables the radix cache on decode workers, and HiCache sits under it.
        argv.append("--disaggregation-decode-enable-radix-cache")
    if not sg.has("hicache_write_policy"):
        argv += ["--hicache-write-policy", "write_through"]
    if device == "cpu":
        if not sg.has("hicache_io_backend"):
            argv += ["--hicache-io-backend", "direct"]
        if not sg.has("hicache_mem_layout"):
            argv += ["--hicache-mem-layout", "layer_first"]
    argv += ["--hicache-storage-backend", "dynamic"]
    argv += ["--hicache-storage-backend-extra-config", json.dumps(backend)]
    return LaunchPlan(argv, ours, sg, advertise, role, kv_events_endpoint=kv_ep,
                      kv_events_replay_endpoint=replay_ep, pool_events_endpoint=pool_ep,
                      backend_config=backend)


MOONCAKE_SCHEME = "mooncake://"


def mooncake_master(pool: str) -> str | None:
    """``HOST:PORT`` of a ``mooncake://HOST:PORT`` pool; None for ``shm``; else LaunchError."""
    if pool == "shm":
        return None
    master = pool.removeprefix(MOONCAKE_SCHEME)
    host, sep, port = master.rpartition(":")
    if not pool.startswith(MOONCAKE_SCHEME) or not sep or not host or not port.isdigit():
        raise LaunchError(f"{POOL} {pool!r}: shm or mooncake://MASTER_HOST:PORT")
    return master


def default_pool_id(pool: str, advertise: str, port: int) -> str:
    """``shm-<hostname>``; for a Mooncake Store, this worker's segment of it,
    ``mooncake-<master host>-<port>@<advertised address>:<server port>`` (one per worker: two
    workers of a host are two clients with two segments; ``radix_global/pool_ids.py``)."""
    master = mooncake_master(pool)
    if master is None:
        return f"shm-{socket.gethostname()}"
    return segment_pool_id("mooncake-" + master.replace(":", "-"), f"{advertise}:{port}")


def event_ports(base: int | None, sglang: SglangArgs, bind: str) -> tuple[int, int, int]:
    """KV-event, replay and pool-event ports: from ``base`` in blocks of one port per dp rank
    (the subscriber connects rank ``r`` at port + ``r``), else free ports on ``bind``."""
    if base is None:
        return free_port(bind), free_port(bind), free_port(bind)
    # events carry the attention-DP rank when DP attention is on, the DP rank otherwise
    dp = max(int(sglang["dp_size"] or 1), int(sglang["attn_dp_size"] or 1))
    if not 1 <= base <= 65535 - 2 * dp:
        raise LaunchError(f"{EVENT_PORT_BASE} {base}: needs ports {base}..{base + 2 * dp}, "
                          "within 1..65535")
    http = int(sglang["port"] or 30000)
    if base <= http <= base + 2 * dp:
        raise LaunchError(f"{EVENT_PORT_BASE} {base}: ports {base}..{base + 2 * dp} include "
                          f"the server's --port {http}")
    return base, base + dp, base + 2 * dp


def _check_pool(ours: OurFlags) -> None:
    """A pool id names a segment of a shared store exactly when it has an ``@``: an shm pool's
    must not (its entries would leave the index with the first worker); a Mooncake segment must
    hold Mooncake's smallest segment."""
    mooncake = mooncake_master(ours.pool) is not None
    if not mooncake and ours.pool_id is not None and is_segment(ours.pool_id):
        raise LaunchError(f"{POOL_ID} {ours.pool_id}: '@' marks a segment of a shared store "
                          f"({POOL} mooncake://...); an shm pool id may not contain it")
    if mooncake and ours.pool_capacity_gb * (1 << 30) < MIN_SEGMENT_BYTES:
        raise LaunchError(f"{flag_of('pool_capacity_gb')} {ours.pool_capacity_gb}: a Mooncake "
                          f"segment needs at least {MIN_SEGMENT_BYTES >> 20} MiB")
    if mooncake and ours.pool_root is not None:
        raise LaunchError(f"{flag_of('pool_root')} is for the shm pool; a Mooncake pool has no "
                          "root")


def registered_role(role: Role | None, mode: str | None) -> Role:
    """The role to register. A given ``--disaggregation-mode`` decides (native PD) and a
    different role of ours is refused; without one, ours (default mixed) is registered as is:
    prefill/decode then means the pool hand-off, where SGLang itself runs a normal server."""
    native = ROLE_OF_MODE[mode]
    if native is not Role.MIXED or role is None:
        if role is not None and role != native:
            raise LaunchError(f"{flag_of('role')} {role.value} contradicts "
                              f"--disaggregation-mode {mode} (role {native.value}); drop one")
        return native
    return role


def _refuse_conflicts(sg: SglangArgs) -> None:
    backend = sg["hicache_storage_backend"]
    if backend == "mooncake":
        # SGLang's own Mooncake backend refuses the layer_first host layout (the only CPU one)
        # and publishes no events: the index could never see its pages, on CPU or GPU.
        raise LaunchError(f"--hicache-storage-backend mooncake: use {POOL} "
                          "mooncake://MASTER:PORT (radix-global's backend over Mooncake Store: "
                          "SGLang's own does not run on CPU and tells the index nothing)")
    if backend is not None and backend != "dynamic":
        raise LaunchError(f"--hicache-storage-backend {backend}: radix-global provides the L3 "
                          "backend (its shared pool); remove the flag")
    if sg.has("kv_events_config"):
        raise LaunchError("--kv-events-config: radix-global configures the KV-event publisher "
                          "itself (ZMQ on the advertised address, replay socket); remove the flag")
    policy = sg["hicache_write_policy"]
    if sg.has("hicache_write_policy") and policy != "write_through":
        raise LaunchError(f"--hicache-write-policy {policy}: the global cache needs "
                          "write_through, so that every computed page reaches the shared pool")
    if sg["disable_radix_cache"]:
        raise LaunchError("--disable-radix-cache: the global cache needs SGLang's radix cache "
                          "(HiCache and the L3 pool sit under it)")
    device = sg["device"]
    io = sg["hicache_io_backend"]
    if device == "cpu" and sg.has("hicache_io_backend") and io != "direct":
        raise LaunchError(f"--hicache-io-backend {io} has no CPU implementation; use direct")
    layout = sg["hicache_mem_layout"]
    if device == "cpu" and sg.has("hicache_mem_layout") and layout != "layer_first":
        raise LaunchError(f"--hicache-mem-layout {layout} is not supported on CPU "
                          "(only layer_first has a CPU transfer path)")
