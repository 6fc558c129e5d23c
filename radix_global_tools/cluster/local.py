"""Start and stop a local CPU cluster for benchmarks: SGLang engines and a router in front.

    with LocalCluster(run_dir) as cluster:
        engines = cluster.start_engines(EngineSet("ours", model_dir, n=2), router_port=p)
        router = cluster.start_router(RouterSpec("ours", "conductor"), engines, port=p)
        ...                                      # replay against router.url
        cluster.stop(router)

Engine kinds
- ``stock``: plain SGLang on CPU (``python -m sglang_patch.cpu_compat -- ...``), local radix cache
  only. With ``kv_events=True`` it also publishes SGLang's KV events on a loopback ZMQ port (what
  our router needs to see caches when the pool is off; sglang-router ignores them). With
  ``grpc=True`` it serves smg's gRPC protocol instead of HTTP (``--smg-grpc-mode``; URLs
  ``grpc://``), whose KV-event stream feeds smg's event-driven index
  (:mod:`radix_global_tools.cluster.smg_grpc`).
- ``ours``: ``radix-global sglang ... --radix-global ROUTER`` (HiCache write-through into the L3
  shared-memory pool, KV + pool events, registration with the router). Each engine set gets a
  fresh pool id under ``pool_root`` (so no contender inherits another's pool); the pool is
  destroyed when the cluster closes.

Router kinds: ``ours`` (``radix-global router --policy P``; with ``stock`` engines they are given
as ``--workers``, ``ours`` engines register themselves) and ``sglang-router`` (the PyPI
``sglang_router.launch_router --policy P --worker-urls ...``).

Every process runs in its own process group with its log in ``run_dir``; waits are bounded and a
start-up failure raises :class:`ClusterError` with the log tail. ``close`` stops everything
(SIGTERM to the group, SIGKILL after ``stop_timeout_s``). Each stop removes the semaphore files
the stopped processes left in /dev/shm (``sglang_patch.sem_sweep``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from radix_global_tools.cluster import smg_grpc
from radix_global_tools.cluster.procs import ClusterError, Proc, stop_group, wait_answering
from sglang_patch import cpu_compat
from sglang_patch.launch_server import cpu_compute_domain
from sglang_patch.ports import free_port
from sglang_patch.sem_sweep import semaphores, sweep_semaphores

CPU_FLAGS = (*cpu_compat.CPU_SERVER_FLAGS, "--dtype", "float32")
MAX_ENGINES = 3
FILE_BACKEND_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"  # SGLang's HiCacheFile reads it
PREFETCH_POLICY = "--hicache-storage-prefetch-policy"


@dataclass(frozen=True)
class EngineSet:
    kind: str  # stock | ours
    model_dir: str
    n: int = 2
    page_size: int = 16
    max_total_tokens: int = 32768
    kv_events: bool = True  # stock only: publish KV events for our router
    pool_capacity_gb: float = 0.5  # ours only
    hicache_ratio: float = 2.0  # ours: the HiCache host tier, x the device KV pool
    pool_root: str = "/dev/shm/radix-global"
    extra_args: tuple[str, ...] = ()
    # stock only: the folder of SGLang's own ``file`` L3 backend, shared by the set's engines
    # (given with ``--hicache-storage-backend file`` in ``extra_args``)
    storage_dir: str | None = None
    # stock only: smg's gRPC server instead of SGLang's HTTP one (smg's event-driven KV index
    # takes its events over it; needs kv_events)
    grpc: bool = False
    # One core per engine (round robin over this process's cores), like one GPU per instance:
    # unpinned engines each run as many compute threads as there are cores, so two computing at
    # once oversubscribe them and the cluster behaves like neither one server nor two.
    pin_cores: bool = True

    def cores(self, index: int) -> set[int] | None:
        """The cores engine ``index`` is pinned to (None: not pinned)."""
        if not self.pin_cores:
            return None
        available = sorted(os.sched_getaffinity(0))
        return {available[index % len(available)]}

    def __post_init__(self) -> None:
        if self.kind not in ("stock", "ours"):
            raise ValueError(f"unknown engine kind {self.kind!r}")
        if not 1 <= self.n <= MAX_ENGINES:
            raise ValueError(f"1..{MAX_ENGINES} engines on this machine, not {self.n}")
        if self.grpc and (self.kind != "stock" or not self.kv_events):
            raise ValueError("grpc engines are stock engines with kv_events")

    def url(self, port: int, host: str = "127.0.0.1") -> str:
        """Engine ``port``'s URL: ``grpc://`` for smg's protocol, else ``http://``."""
        return f"{smg_grpc.SCHEME if self.grpc else 'http://'}{host}:{port}"


@dataclass(frozen=True)
class RouterSpec:
    kind: str  # ours | sglang-router | smg (sglang-router's successor, SGLang's gateway)
    policy: str
    options: dict[str, str] = field(default_factory=dict)  # extra --flag value pairs


class Engines(NamedTuple):
    spec: EngineSet
    procs: list[Proc]
    pool_id: str | None

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.procs]


def cpu_env() -> dict[str, str]:
    # The CPU HiCache patches must reach stock engines too (--enable-hierarchical-cache): the
    # child environment lists the patch modules this process has imported.
    from sglang_patch import hicache_cpu  # noqa: F401

    return cpu_compat.child_env({**os.environ})


def engine_argv(spec: EngineSet, port: int, index: int, router_url: str | None,
                pool_id: str | None, host: str = "127.0.0.1", worker_id: str | None = None,
                events_endpoint: str | None = None) -> list[str]:
    """One engine's command line; ``events_endpoint``: a stock engine's KV-event PUB (default
    a free loopback port)."""
    common = ["--model-path", spec.model_dir, "--host", host, "--port", str(port),
              *CPU_FLAGS, "--page-size", str(spec.page_size),
              "--max-total-tokens", str(spec.max_total_tokens), "--log-level", "warning",
              *spec.extra_args]
    if spec.kind == "stock":
        argv = [sys.executable, "-m", "sglang_patch.cpu_compat", "--", *common,
                *(["--smg-grpc-mode"] if spec.grpc else [])]
        if spec.kv_events:
            # bind: on a concrete address SGLang's publisher connects unless told to bind, and
            # the router's subscriber connects too: no event would ever arrive
            argv += ["--kv-events-config", json.dumps({
                "publisher": "zmq", "topic": "kv-events", "bind": True,
                "endpoint": events_endpoint or f"tcp://127.0.0.1:{free_port()}"})]
        return argv
    if router_url is None or pool_id is None:
        raise ValueError("ours engines need the router URL and a pool id")
    return [sys.executable, "-m", "radix_global_cli", "sglang", *common,
            "--radix-global", router_url,
            "--radix-global-worker-id", worker_id or f"eng-{index}-{port}",
            "--radix-global-pool-id", pool_id,
            *(["--radix-global-pool-root", spec.pool_root] if spec.pool_root else []),
            "--radix-global-pool-capacity-gb", str(spec.pool_capacity_gb),
            "--hicache-ratio", str(spec.hicache_ratio),
            # the harness waits for every prefetch unless the engine set chose a policy
            *([] if any(a.split("=", 1)[0] == PREFETCH_POLICY for a in spec.extra_args)
              else [PREFETCH_POLICY, "wait_complete"]),
            "--radix-global-heartbeat-interval-s", "1"]


# Run as modules: both packages install a `smg` script.
PEER_MODULES = {"sglang-router": "sglang_router.launch_router", "smg": "smg.launch_router"}


def router_argv(spec: RouterSpec, port: int, workers: Sequence[str], model_dir: str
                ) -> list[str]:
    extra = [a for k, v in spec.options.items() for a in (k, v)]
    if spec.kind in PEER_MODULES:  # their metrics listener binds 0.0.0.0:29000 unless told
        quiet = ["--log-level", "warn"] if spec.kind == "smg" else []  # as ours: no line a request
        # smg tokenizes with the model's tokenizer where it has one, as its users run it
        tokenizer = ["--model-path", model_dir] if spec.kind == "smg" and model_dir else []
        return [sys.executable, "-m", PEER_MODULES[spec.kind], "--host", "127.0.0.1",
                "--port", str(port), "--worker-urls", *workers, "--policy", spec.policy,
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), *quiet,
                *tokenizer, *extra]
    if spec.kind != "ours":
        raise ValueError(f"unknown router kind {spec.kind!r}")
    argv = [sys.executable, "-m", "radix_global_cli", "router", "--host", "127.0.0.1",
            "--port", str(port), "--policy", spec.policy, "--model-path", model_dir,
            "--log-level", "warning", *extra]
    return argv + (["--workers", *workers] if workers else [])


class LocalCluster:
    """Owns every process it starts; use as a context manager."""

    def __init__(self, run_dir: str | Path, startup_timeout_s: float = 600.0,
                 stop_timeout_s: float = 20.0) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.procs: list[Proc] = []
        self.pools: list[tuple[str, str]] = []  # (pool id, root) to destroy on close
        self.sems = semaphores()  # /dev/shm before any engine of this cluster started
        self._sigterm: Any = None  # the SIGTERM handler before ours, while ours is set

    def __enter__(self) -> LocalCluster:
        # SIGTERM (a timeout, CI, a user's kill) would end this process at once and leave its
        # engines, their own children and shared memory behind (each runs in its own session);
        # as SystemExit it unwinds through close(). Only where nobody chose a handler already,
        # and only the main thread may set one.
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)
                self._sigterm = None

    def _spawn(self, name: str, argv: list[str], url: str, env: dict[str, str] | None = None,
               cores: set[int] | None = None) -> Proc:
        log_path = self.run_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            out.write(("$ " + " ".join(argv) + "\n").encode())
            out.flush()
            popen = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT,
                env=env or dict(os.environ), start_new_session=True,
                preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores))
        proc = Proc(name, popen, url, log_path)
        self.procs.append(proc)
        return proc

    def wait_healthy(self, procs: Sequence[Proc], timeout_s: float | None = None,
                     path: str = "/health", accept: tuple[int, ...] = (200,)) -> None:
        def status(url: str) -> int:  # a gRPC engine's HealthCheck, told as the HTTP codes
            if smg_grpc.is_grpc(url):
                return 200 if smg_grpc.healthy(url) else 503
            return client.get(url).status_code

        with httpx.Client(timeout=3.0) as client:
            wait_answering(procs, status, path, accept, timeout_s or self.startup_timeout_s)

    def start_engines(self, spec: EngineSet, router_url: str | None = None,
                      tag: str = "") -> Engines:
        """Start ``spec.n`` engines and wait until all are healthy. ``ours`` engines register
        with ``router_url`` (which must be up, or come up within their retry window)."""
        pool_id = None
        if spec.kind == "ours":
            pool_id = f"bench-{uuid.uuid4().hex[:8]}"
            self.pools.append((pool_id, spec.pool_root))
        env = cpu_env()
        if spec.storage_dir is not None:
            Path(spec.storage_dir).mkdir(parents=True, exist_ok=True)
            env[FILE_BACKEND_DIR_ENV] = spec.storage_dir
        if spec.grpc:
            env.update(smg_grpc.ENV)
        procs = []
        for i in range(spec.n):
            port = free_port()
            argv = engine_argv(spec, port, i, router_url, pool_id)
            procs.append(self._spawn(f"{tag}engine{i}-{spec.kind}-{port}", argv, spec.url(port),
                                     env, spec.cores(i)))
        self.wait_healthy(procs)
        return Engines(spec, procs, pool_id)

    def start_router(self, spec: RouterSpec, engines: Engines | None, port: int | None = None,
                     tag: str = "", wait: bool = True, model_dir: str | None = None) -> Proc:
        """Start a router; with ``wait`` it must answer (bounded). ``model_dir`` (tokenizer) is
        needed when no engines are given yet (our engines register after the router is up)."""
        port = port or free_port()
        workers: list[str] = []
        if engines is not None and (spec.kind == "sglang-router" or engines.spec.kind == "stock"):
            workers = engines.urls
            if spec.kind == "ours":  # the compute domain ours engines declare when they register
                workers = [f"{url}#compute_domain={cpu_compute_domain(engines.spec.cores(i))}"
                           for i, url in enumerate(workers)]
        model_dir = model_dir or (engines.spec.model_dir if engines is not None else None)
        if not model_dir:
            raise ValueError("start_router needs engines or model_dir")
        argv = router_argv(spec, port, workers, model_dir)
        proc = self._spawn(f"{tag}router-{spec.kind}-{spec.policy}-{port}", argv,
                           f"http://127.0.0.1:{port}")
        if wait:  # our router answers 503 on /health until a worker registers: up is enough
            self.wait_healthy([proc], timeout_s=120.0, accept=(200, 503))
        return proc

    def wait_workers(self, router: Proc, n: int, timeout_s: float = 180.0) -> None:
        """Until our router lists ``n`` workers (registered or discovered) and has finished
        profiling them (router/cluster/profiling.py: the replay must not compete with it),
        bounded."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=3.0) as client:
            while time.monotonic() < deadline:
                if router.popen.poll() is not None:
                    raise ClusterError(f"{router.name} exited:\n{router.log_tail()}")
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    resp = client.get(router.url + "/admin/workers")
                    if (resp.status_code == 200 and len(_worker_list(resp.json())) >= n
                            and _profiled(client, router.url)):
                        return
                time.sleep(0.5)
        raise ClusterError(f"{router.name}: fewer than {n} workers after {timeout_s} s:\n"
                           f"{router.log_tail()}")

    def stop(self, proc: Proc) -> None:
        stop_group(proc.popen, self.stop_timeout_s)
        sweep_semaphores(self.sems, groups=[proc.popen.pid])
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_engines(self, engines: Engines) -> None:
        for p in engines.procs:
            self.stop(p)
        if engines.pool_id is not None:
            self._destroy_pool(engines.pool_id, engines.spec.pool_root)

    def _destroy_pool(self, pool_id: str, root: str) -> None:
        from sglang_patch.pool.shm_pool import destroy_pool

        with contextlib.suppress(Exception):
            destroy_pool(pool_id, root)
        with contextlib.suppress(ValueError):
            self.pools.remove((pool_id, root))

    def close(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc)
        for pool_id, root in list(self.pools):
            self._destroy_pool(pool_id, root)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _worker_list(data: object) -> list[object]:
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in ("workers", "data"):
            if isinstance(data.get(key), list):
                return list(data[key])
    return []


def flush_caches(urls: Sequence[str], timeout_s: float = 60.0) -> list[str]:
    """``POST /flush_cache`` on every engine (SGLang drops its radix cache when idle; gRPC
    engines: ``FlushCache``); returns the URLs that refused (busy engines answer 400 until their
    requests finish)."""
    failed = []
    with httpx.Client(timeout=timeout_s) as client:
        for url in urls:
            if smg_grpc.is_grpc(url):
                if not smg_grpc.flush(url, timeout_s):
                    failed.append(url)
                continue
            ok = False
            deadline = time.monotonic() + timeout_s
            while not ok and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    ok = client.post(url + "/flush_cache").status_code == 200
                if not ok:
                    time.sleep(1.0)
            if not ok:
                failed.append(url)
    return failed


def _profiled(client: httpx.Client, url: str) -> bool:
    """No worker profiling in progress on our router (older routers do not report it)."""
    resp = client.get(url + "/admin/stats")
    return resp.status_code != 200 or not resp.json().get("profiling_pending", 0)
