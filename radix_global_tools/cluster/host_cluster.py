"""radix-global across test hosts: workers, a router and an index service, each on a host of its
own (``radix_global_tools/cluster/hosts.py``), that reach each other only over the hosts' links.

    with HostSet(["a", "b", "r"], run_dir) as hosts:
        cluster = HostCluster(hosts, model_dir, client_host="r")
        router = cluster.start_router("r")
        workers = [cluster.start_worker(h, router, cores={i}) for i, h in enumerate("ab")]
        cluster.wait_workers(router, {"w-a", "w-b"})
        cluster.request("POST", router.url + "/v1/chat/completions", json={...})
        cluster.close()

What it starts, per host, all inside the host's namespace (``ip netns exec``):
- workers: ``radix-global sglang`` on real SGLang CPU engines, ``--host`` = the host's address
  (so the advertised address is the one other hosts reach), registered with the router under
  the cluster's admin token (cross-host admin needs it), each with its host's own pool root and
  pool id, heartbeats every second;
- the router: ``radix-global router --host ADDR --admin-token T`` (conductor policy by default);
- the index service: ``radix-global index serve --host ADDR --admin-token T``.
Every HTTP call of the caller goes through :meth:`HostCluster.request`, which sends it from the
client host's namespace (:func:`radix_global_tools.cluster.netns.netns_executor`). Waits are
bounded; a process that exits or does not answer in time raises
:class:`radix_global_tools.cluster.procs.ClusterError` with its log.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import httpx

from radix_global_tools.cluster.hosts import HostSet
from radix_global_tools.cluster.local import MAX_ENGINES, EngineSet, cpu_env, engine_argv
from radix_global_tools.cluster.netns import netns_executor
from radix_global_tools.cluster.procs import ClusterError, log_tail, stop_group, wait_answering
from sglang_patch.launch_plan import default_pool_id
from sglang_patch.sem_sweep import semaphores, sweep_semaphores

# SGLang engines: each takes seconds to leave on SIGTERM, so close() stops them together
ENGINE_NAMES = ("worker", "stock")

ROUTER_PORT = 30080
WORKER_PORT = 30000
INDEX_PORT = 50051
T = TypeVar("T")


class HostProc(NamedTuple):
    host: str
    name: str
    popen: subprocess.Popen[bytes]
    url: str  # http://ADDR:PORT (the index service: ADDR:PORT)
    log_path: Path

    def log_tail(self, chars: int = 4000) -> str:
        return log_tail(self.log_path, chars)


class HostCluster:
    """Owns the processes it starts on ``hosts`` (not the hosts themselves)."""

    def __init__(self, hosts: HostSet, model_dir: str | Path, client_host: str,
                 admin_token: str | None = None, page_size: int = 16,
                 stop_timeout_s: float = 20.0) -> None:
        self.hosts, self.model_dir, self.page_size = hosts, str(model_dir), page_size
        self.admin_token = admin_token or secrets.token_hex(16)
        self.stop_timeout_s = stop_timeout_s
        self.procs: list[HostProc] = []
        self.sems = semaphores()  # /dev/shm (one for every host) before its engines started
        self._client_pool = netns_executor(hosts[client_host].netns)
        self._http = httpx.Client(timeout=300.0)  # its connections open in the pool's threads

    # --- calls from the client host -----------------------------------------------------------
    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread inside the client host's namespace."""
        return self._client_pool.submit(fn, *args, **kwargs).result()

    def request(self, method: str, url: str, admin: bool = False, **kwargs: Any
                ) -> httpx.Response:
        """One HTTP request from the client host; ``admin`` adds the admin token."""
        if admin:
            kwargs["headers"] = {**kwargs.get("headers", {}),
                                 "Authorization": f"Bearer {self.admin_token}"}
        return self.call(self._http.request, method, url, **kwargs)

    # --- processes ------------------------------------------------------------------------------
    def _spawn(self, host: str, name: str, argv: list[str], url: str,
               cores: set[int] | None = None, env: dict[str, str] | None = None) -> HostProc:
        popen = self.hosts.spawn(host, name, argv, env={**cpu_env(), **(env or {})}, cores=cores)
        proc = HostProc(host, name, popen, url, self.hosts.log_path(host, name))
        self.procs.append(proc)
        return proc

    def start_router(self, host: str, policy: str = "conductor", options: Sequence[str] = (),
                     port: int = ROUTER_PORT) -> HostProc:
        address = self.hosts[host].address
        argv = [sys.executable, "-m", "radix_global_cli", "router", "--host", address,
                "--port", str(port), "--policy", policy, "--model-path", self.model_dir,
                "--admin-token", self.admin_token, "--log-level", "warning", *options]
        proc = self._spawn(host, f"router{port}", argv, self.hosts.url(host, port))
        # our router answers 503 on /health until a worker registers: up is enough
        self.wait_http([proc], "/health", accept=(200, 503), timeout_s=120.0)
        return proc

    def start_index(self, host: str, heartbeat_timeout_s: float = 20.0) -> HostProc:
        address = self.hosts[host].address
        argv = [sys.executable, "-m", "radix_global_cli", "index", "serve", "--host", address,
                "--port", str(INDEX_PORT), "--admin-token", self.admin_token,
                "--heartbeat-timeout-s", str(heartbeat_timeout_s)]
        return self._spawn(host, "index", argv, f"{address}:{INDEX_PORT}")

    def _engines(self, host: str, extra: Sequence[str], kind: str = "ours",
                 shm: bool = True, pool_capacity_gb: float = 0.25) -> EngineSet:
        return EngineSet(kind, self.model_dir, n=1, page_size=self.page_size,
                         max_total_tokens=16384, pool_capacity_gb=pool_capacity_gb,
                         pool_root=self.hosts[host].pool_root if shm else "", extra_args=(
                             "--served-model-name", "tiny", "--enable-cache-report", *extra))

    def worker_argv(self, host: str, router: HostProc, extra: Sequence[str] = (),
                    mooncake: str | None = None, pool_capacity_gb: float = 0.25) -> list[str]:
        """``radix-global sglang`` on ``host``'s address, with the cluster's admin token and the
        host's own shm pool, or the Mooncake Store at ``mooncake`` (``HOST:PORT``) that every
        host shares (``radix_global_tools.cluster.local.engine_argv``)."""
        pool = f"mooncake://{mooncake}" if mooncake else "shm"
        spec = self._engines(host, ["--radix-global-admin-token", self.admin_token,
                                   "--radix-global-pool", pool, *extra],
                             shm=not mooncake, pool_capacity_gb=pool_capacity_gb)
        address = self.hosts[host].address
        pool_id = (default_pool_id(pool, address, WORKER_PORT) if mooncake
                   else self.hosts[host].pool_id)
        return engine_argv(spec, WORKER_PORT, 0, router.url, pool_id,
                           host=self.hosts[host].address, worker_id=f"w-{host}")

    def start_worker(self, host: str, router: HostProc, cores: set[int] | None = None,
                     extra: Sequence[str] = (), mooncake: str | None = None,
                     env: dict[str, str] | None = None, pool_capacity_gb: float = 0.25
                     ) -> HostProc:
        """Start a worker on ``host`` (not waited for: see :meth:`wait_http`); ``env`` is added
        to its environment."""
        argv = self.worker_argv(host, router, extra, mooncake, pool_capacity_gb)
        return self._start_engine(host, "worker", argv, cores, env)

    def start_mooncake_master(self, host: str, port: int = 50051,
                              options: Sequence[str] = ()) -> str:
        """``mooncake_master`` on ``host`` (its listeners bind every interface: only ever in a
        test host), with its own ``options``; its ``HOST:PORT``, once it accepts connections."""
        binary = str(Path(sys.executable).parent / "mooncake_master")
        proc = self._spawn(host, "mooncake", [binary, f"--rpc_port={port}",
                                              "--metrics_port=9003", *options],
                           self.hosts.url(host, 9003))
        self.wait_http([proc], "/metrics", timeout_s=60.0)
        return f"{self.hosts[host].address}:{port}"

    def start_stock_worker(self, host: str, cores: set[int] | None = None) -> HostProc:
        """Plain SGLang on ``host`` (no wrapper, no registration), publishing its KV events on
        SGLang's own ``tcp://*:5557``: what a router-only deployment sits in front of."""
        argv = engine_argv(self._engines(host, (), "stock"), WORKER_PORT, 0, None, None,
                           host=self.hosts[host].address, events_endpoint="tcp://*:5557")
        return self._start_engine(host, "stock", argv, cores)

    def _start_engine(self, host: str, name: str, argv: list[str], cores: set[int] | None,
                      env: dict[str, str] | None = None) -> HostProc:
        if sum(p.name in ENGINE_NAMES for p in self.procs) >= MAX_ENGINES:
            raise ClusterError(f"at most {MAX_ENGINES} engines on this machine")
        return self._spawn(host, name, argv, self.hosts.url(host, WORKER_PORT), cores, env)

    def wait_http(self, procs: Sequence[HostProc], path: str = "/health",
                  accept: tuple[int, ...] = (200,), timeout_s: float = 600.0) -> None:
        """Until every process answers ``path`` with a status in ``accept``, bounded."""
        wait_answering(procs, lambda url: self.request("GET", url, timeout=5.0).status_code,
                       path, accept, timeout_s)

    def workers(self, router: HostProc) -> list[dict[str, Any]]:
        """The router's ``/admin/workers`` list."""
        resp = self.request("GET", router.url + "/admin/workers", admin=True, timeout=10.0)
        resp.raise_for_status()
        return list(resp.json()["workers"])

    def wait_workers(self, router: HostProc, ids: set[str], timeout_s: float = 300.0) -> None:
        """Until the router lists exactly the worker ids ``ids`` and profiled them, bounded."""
        deadline = time.monotonic() + timeout_s
        listed: set[str] = set()
        while time.monotonic() < deadline:
            if router.popen.poll() is not None:
                raise ClusterError(f"router exited:\n{router.log_tail()}")
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                listed = {w["worker_id"] for w in self.workers(router)}
                stats = self.request("GET", router.url + "/admin/stats", admin=True).json()
                if listed == ids and not stats.get("profiling_pending"):
                    return
            time.sleep(0.5)
        raise ClusterError(f"router lists {sorted(listed)}, not {sorted(ids)}, after "
                           f"{timeout_s} s:\n{router.log_tail()}")

    def stop(self, proc: HostProc) -> None:
        stop_group(proc.popen, self.stop_timeout_s)
        sweep_semaphores(self.sems, groups=[proc.popen.pid])
        if proc in self.procs:
            self.procs.remove(proc)

    def forget(self, host: str) -> None:
        """The processes of a host that failed (``HostSet.fail`` killed them): reap, forget."""
        gone = [p for p in self.procs if p.host == host]
        for proc in gone:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)
            self.procs.remove(proc)
        sweep_semaphores(self.sems, groups=[p.popen.pid for p in gone])

    def close(self) -> None:
        """Stop every process: the engines together (each takes seconds to leave on SIGTERM),
        then the rest, last started first."""
        engines = [p for p in self.procs if p.name in ENGINE_NAMES]
        try:
            if engines:
                with ThreadPoolExecutor(len(engines)) as pool:
                    list(pool.map(lambda p: stop_group(p.popen, self.stop_timeout_s), engines))
                sweep_semaphores(self.sems, groups=[p.popen.pid for p in engines])
                self.procs = [p for p in self.procs if p not in engines]
        finally:
            for proc in reversed(list(self.procs)):
                self.stop(proc)
        self._client_pool.submit(self._http.close).result()
        self._client_pool.shutdown()
