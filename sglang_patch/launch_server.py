"""``radix-global sglang [SGLang flags] --radix-global URL``: SGLang that joins radix-global.

Also ``python -m sglang_patch.launch_server``. Flags: ``radix-global sglang --help``
(``sglang_patch/launch_args.py``); the plan: ``sglang_patch/launch_plan.py``.

This process is a supervisor: it checks the environment (SGLang version, dependencies), starts
``python -m sglang.launch_server`` with the planned flags in its own process group (on ``--device
cpu`` with the CPU patches, which reach SGLang's spawned scheduler through
``cpu_compat.child_env()``), waits until it is healthy, registers it (``register.py``), sends
heartbeats, and on exit (SIGTERM/SIGINT or the server dying) deregisters and stops the server.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from radix_global.pool_ids import disk_holder
from radix_global.registration import RegistrationError, WorkerInfo
from sglang_patch.launch_args import flag_of, help_text, parse_argv
from sglang_patch.launch_plan import LaunchError, LaunchPlan, plan_launch
from sglang_patch.load_probe import LoadProbeError, probe_load
from sglang_patch.pool.base import PoolError
from sglang_patch.pool.disk_folder import FOLDER_MODE, UnsafeDiskFolder, check_folder
from sglang_patch.pool.disk_format import read_bandwidth_Bps
from sglang_patch.pool.mooncake_stall import bound_stalls, stall_seconds
from sglang_patch.ports import endpoint_taken
from sglang_patch.register import (
    TOKEN_ENV,
    Registrar,
    RegistrationRefused,
    kv_bytes_per_token,
    namespace_for,
)
from sglang_patch.sem_sweep import semaphores, sweep_semaphores

log = logging.getLogger("radix_global.sglang")
SGLANG_VERSION = "0.5.23"
REQUIRED_MODULES = ("torch", "zmq", "msgspec", "xxhash", "numpy", "httpx")
READY_TIMEOUT_ENV = "RADIX_GLOBAL_READY_TIMEOUT"
SGLANG_PREFETCH_THRESHOLD = 256  # HiCache's default storage prefetch threshold, in tokens
PORT_RETRIES = 3  # new event ports when one this wrapper picked was taken (_picked_port_taken)


def check_environment(plan: LaunchPlan) -> None:
    """Fail before starting anything when SGLang or a dependency is missing or the wrong one,
    or our flags cannot work together."""
    check_sglang()
    if plan.flags.worker_id and plan.flags.worker_id == plan.flags.pool_id:
        raise LaunchError(f"{flag_of('worker_id')} and {flag_of('pool_id')} must differ (one "
                          "id space for holders)")
    if plan.flags.pool_disk:  # the backend's own check would fail deep inside SGLang's scheduler
        try:
            check_folder(plan.flags.pool_disk)
        except UnsafeDiskFolder as exc:
            raise LaunchError(str(exc)) from exc
        except OSError as exc:
            raise LaunchError(f"{flag_of('pool_disk')} {plan.flags.pool_disk}: {exc}") from exc


def check_sglang() -> None:
    """SGLang installed, the version we are built for, and our dependencies (before SGLang's
    parser reads the command line)."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError as exc:
        raise LaunchError(f"SGLang is not installed; radix-global needs sglang=={SGLANG_VERSION}"
                          ) from exc
    if version != SGLANG_VERSION:
        raise LaunchError(f"SGLang {version} is installed; radix-global's storage backend and "
                          f"patches are built for sglang=={SGLANG_VERSION}")
    missing = [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise LaunchError(f"missing Python packages: {', '.join(missing)}")


def server_env(plan: LaunchPlan) -> dict[str, str]:
    from sglang_patch import cpu_compat

    repo = str(cpu_compat.REPO_ROOT)
    if plan.device == "cpu":
        # Importing registers their patches for SGLang's spawned scheduler (see cpu_compat).
        from sglang_patch import hicache_cpu, lora_cpu, pd_cpu  # noqa: F401

        env = cpu_compat.child_env()
    else:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    if plan.flags.admin_token:  # the pool backend asks the router for aliases (never on argv)
        env[TOKEN_ENV] = plan.flags.admin_token
    # SGLang's PD listeners (KV manager, Mooncake) announce an address of this host to their
    # peers; its own guess is the first interface's, which on a multi-homed host may not be the
    # advertised one. A loopback advertisement is a single-host set-up: SGLang's guess stays.
    address = _ip(plan.advertise_host.strip("[]"))
    if (address is not None and not address.is_loopback and "SGLANG_HOST_IP" not in env
            and "HOST_IP" not in env):
        env["SGLANG_HOST_IP"] = str(address)
    if plan.backend_config.get("pool") == "mooncake":
        # the stall bound in the engine's environment from its start: every Mooncake
        # transport of the process reads it, and none runs yet to race a change of it
        try:
            bound_stalls(stall_seconds(plan.backend_config), env)
        except PoolError as exc:
            raise LaunchError(f"the Mooncake stall bound: {exc}") from None
    return env


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def wait_ready(proc: subprocess.Popen[bytes], base: str, timeout_s: float) -> dict[str, Any]:
    """Poll ``/health`` until it answers 200, then return ``/server_info``."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LaunchError(f"SGLang exited with code {proc.returncode} before it was ready")
            try:
                if client.get(f"{base}/health").status_code == 200:
                    info = client.get(f"{base}/server_info")
                    return dict(info.json()) if info.status_code == 200 else {}
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    raise LaunchError(f"SGLang did not become healthy within {timeout_s:.0f} s")


def cpu_compute_domain(cpus: set[int] | None = None) -> str:
    """``cpu@<host>:<cores>`` of this process's CPU affinity (or ``cpus``): engines on the same
    cores share their compute; engines pinned to disjoint cores do not."""
    cores = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    return f"cpu@{socket.gethostname()}:{','.join(map(str, cores))}"


def worker_info(plan: LaunchPlan, server: dict[str, Any], namespace: str) -> WorkerInfo:
    bootstrap = server.get("disaggregation_bootstrap_port")
    # A pool hand-off prefill worker (our role prefill alone) runs no bootstrap server.
    native_prefill = plan.mode == "prefill"
    page_size = int(server.get("page_size") or 1)
    kv_bytes = kv_bytes_per_token(plan.model_path, server)
    return WorkerInfo(
        worker_id=plan.flags.worker_id or f"sgl-{plan.advertise_host.strip('[]')}-{plan.port}",
        url=plan.url,
        model=str(server.get("served_model_name") or plan.model_path),
        namespace=namespace,
        page_size=page_size,
        role=plan.role,
        dp_size=int(server.get("dp_size") or 1),
        engine="sglang",
        kv_events_endpoint=plan.kv_events_endpoint,
        kv_events_replay_endpoint=plan.kv_events_replay_endpoint,
        pool_id=plan.flags.pool_id,
        pool_events_endpoint=plan.pool_events_endpoint,
        bootstrap_port=int(bootstrap) if native_prefill and bootstrap else None,
        # CPU engines on the same cores share them; GPU engines each have their own device.
        compute_domain=cpu_compute_domain() if plan.device == "cpu" else None,
        kv_bytes_per_token=kv_bytes,
        pool_aliases="pool_aliases_url" in plan.backend_config,
        pool_fetch_min_tokens=fetch_min_tokens(plan.backend_config, page_size),
        pool_prefetch_budget_tokens=(prefetch_budget_tokens(server, kv_bytes)
                                     if plan.backend_config else 0),
        place=plan.flags.place,
        pool_capacity_bytes=(int(plan.flags.pool_capacity_gb * (1 << 30))
                             if plan.backend_config else None),
        **_disk_fields(plan),
    )


def fetch_min_tokens(backend_config: dict[str, Any], page_size: int) -> int:
    """The shortest storage hit SGLang prefetches: its ``prefetch_threshold`` (extra config,
    default 256 tokens), at least one page (``HiCacheController``)."""
    if not backend_config:
        return 0
    return max(int(backend_config.get("prefetch_threshold", SGLANG_PREFETCH_THRESHOLD)),
               page_size)


def prefetch_budget_tokens(server: dict[str, Any], kv_bytes: int | None) -> int:
    """Half the engine's HiCache host tier, in tokens: SGLang declines new storage prefetches
    while those it has not yet admitted hold that much (``prefetch_capacity_limit``; interfaces.md,
    "Worker registration"). The tier is ``hicache_size`` GB when set (per rank: over the rank's
    share of ``kv_bytes``, the whole model's per-token KV), else ``hicache_ratio`` x the device
    pool's tokens (``max_total_num_tokens``, top level or of the first DP rank). 0 (no limit
    known) in ``buffer_only`` mode, without HiCache, or when ``/server_info`` does not say."""
    if (not server.get("enable_hierarchical_cache")
            or server.get("hicache_host_memory_mode", "cache") != "cache"):
        return 0
    size_gb, ratio = server.get("hicache_size") or 0, server.get("hicache_ratio") or 0
    if size_gb > 0:
        ranks = int(server.get("tp_size") or 1) * int(server.get("pp_size") or 1)
        host = int(size_gb * 1e9 * ranks / kv_bytes) if kv_bytes else 0
    else:
        states = server.get("internal_states")
        first = states[0] if isinstance(states, list) and states else {}
        device = server.get("max_total_num_tokens") or (
            first.get("max_total_num_tokens") if isinstance(first, dict) else None)
        host = int(device * ratio) if isinstance(device, int) and ratio > 0 else 0
    return max(0, host // 2)


def _disk_fields(plan: LaunchPlan) -> dict[str, Any]:
    """The disk tier's holder and its measured read bandwidth (docs/interfaces.md,
    "The persistent disk tier under the pool")."""
    folder = plan.flags.pool_disk
    if not folder or plan.flags.pool_id is None:
        return {}
    holder = {"pool_disk_id": disk_holder(plan.flags.pool_id)}
    try:
        Path(folder).mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)
        bandwidth = read_bandwidth_Bps(folder)
    except OSError as exc:  # the router then prices the disk at its default bandwidth
        log.warning("cannot measure the disk tier %s: %r", folder, exc)
        return holder
    log.info("disk tier %s reads at %.0f MB/s", folder, bandwidth / 1e6)
    return {**holder, "pool_disk_read_Bps": bandwidth}


def with_load_rate(plan: LaunchPlan, info: WorkerInfo) -> WorkerInfo:
    """``info`` with the engine's measured load path from the pool (``pool_load_Bps``,
    ``docs/interfaces.md``, "Worker registration"), when it has a pool and answers ``/generate``
    itself (a native PD prefill worker needs a decode peer); unchanged when the probe is off or
    fails."""
    tokens = plan.flags.pool_load_probe_tokens
    native_pd = plan.mode not in (None, "null")
    if tokens <= 0 or native_pd or not plan.backend_config or not info.kv_bytes_per_token:
        return info
    try:
        rate, sample = probe_load(plan.url, tokens, info.kv_bytes_per_token)
    except LoadProbeError as exc:  # the router then prices by the pool's bandwidth alone
        log.warning("no load-path probe: %s", exc)
        return info
    log.info("loads from the pool at %.1f MB/s (%d of %d tokens in %.3f s, cold %.3f s)",
             rate / 1e6, sample.storage_tokens, sample.prompt_tokens, sample.loaded_s,
             sample.cold_s)
    return msgspec.structs.replace(info, pool_load_Bps=rate)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the supervisor dies, even by SIGKILL, so a
    crashed wrapper never leaves an unregistered engine running (Linux prctl)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _start(plan: LaunchPlan) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "sglang.launch_server", *plan.sglang_argv]
    log.info("starting: %s", " ".join(cmd))
    return subprocess.Popen(cmd, env=server_env(plan), start_new_session=True,
                            preexec_fn=_die_with_parent)


def _picked_port_taken(plan: LaunchPlan) -> bool:
    """After the engine exited before it was ready: whether another process now holds an event
    port this wrapper picked for it. Wrappers started at once on one host can pick the same free
    port; the engine that binds it second dies (seen in CI: ZMQ "Address already in use")."""
    if plan.flags.event_port_base is not None:  # the operator's ports: theirs to fix
        return False
    endpoints = (plan.kv_events_endpoint, plan.kv_events_replay_endpoint,
                 plan.pool_events_endpoint)
    return any(endpoint_taken(ep) for ep in endpoints if ep)


def run(argv: list[str]) -> int:
    check_sglang()
    args = parse_argv(argv)
    model_path = str(args.sglang["model_path"])
    served = str(args.sglang["served_model_name"] or model_path)
    default_ns = namespace_for(served, model_path)
    plan = plan_launch(args, default_namespace=default_ns)
    check_environment(plan)
    sems = semaphores()  # the engine's own are removed after it stopped (sem_sweep)
    proc = _start(plan)
    registrar: Registrar | None = None
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for attempt in range(PORT_RETRIES + 1):
            try:
                server = wait_ready(proc, plan.url,
                                    float(os.environ.get(READY_TIMEOUT_ENV, "900")))
                break
            except LaunchError:
                if (proc.poll() is None or attempt == PORT_RETRIES
                        or not _picked_port_taken(plan)):
                    raise
                log.warning("SGLang exited: an event port this wrapper picked was taken before "
                            "it bound it; starting again on new ports")
                plan = plan_launch(args, default_namespace=default_ns)
                proc = _start(plan)
        namespace = str(plan.backend_config.get("namespace") or default_ns)
        info = worker_info(plan, server, namespace)
        if plan.flags.radix_global:
            info = with_load_rate(plan, info)
            registrar = Registrar(plan.flags.radix_global, info, plan.flags.admin_token,
                                  plan.flags.heartbeat_interval_s)
            registrar.register()
            registrar.start_heartbeats()
            print(f"radix-global: {info.worker_id} joined {plan.flags.radix_global} "
                  f"(namespace {namespace}, pool {plan.flags.pool_id}, prefetch budget "
                  f"{info.pool_prefetch_budget_tokens or 'unknown'} tokens)", flush=True)
        else:
            print(f"radix-global: {info.worker_id} serving standalone with pool "
                  f"{plan.flags.pool_id} (namespace {namespace})", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 0 if stopping else 130
    finally:
        if registrar is not None:
            registrar.stop()
        try:
            _stop(proc)
        finally:
            sweep_semaphores(sems, groups=[proc.pid])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or "-h" in args or "--help" in args:
        print(help_text(), end="")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat otherwise
    try:
        return run(args)
    except (LaunchError, RegistrationRefused, RegistrationError) as exc:
        print(f"radix-global sglang: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
