"""The workers and probes of ``benchmarks/scenarios/pd_bench.py``: a prefill/decode pair of real
SGLang CPU workers started by our launch wrapper (pool hand-off pair, or native PD pair over
Mooncake TCP), the shared-memory pool as seen from the benchmark, and the KV size of a prompt token.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.paths import REPO
from radix_global import keys
from radix_global.types import Namespace
from router.routing.contract import RouteRequest
from sglang_patch import cpu_compat
from sglang_patch.ports import free_port
from sglang_patch.sem_sweep import semaphores, sweep_semaphores

PAGE = 4
NS = Namespace("tiny@pdbench")
CPU_FLAGS = [*cpu_compat.CPU_SERVER_FLAGS, "--dtype", "float32",
             "--max-total-tokens", "16384", "--page-size", str(PAGE), "--hicache-ratio", "2",
             "--hicache-storage-prefetch-policy", "wait_complete"]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def in_private_netns() -> bool:
    """Only ``lo`` here: Mooncake's all-interface listeners stay private. (Asks the kernel for
    this process's network namespace; ``/sys/class/net`` shows the namespace sysfs was mounted
    in.)"""
    import socket

    return [name for _, name in socket.if_nameindex()] == ["lo"]


@contextlib.contextmanager
def workers(model: str, pool_id: str, run_dir: Path, native_bootstrap: int | None = None,
            timeout: float = 900) -> Iterator[dict[str, str]]:
    """P and D (pool pair), or with ``native_bootstrap`` a native PD prefill/decode pair."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    urls: dict[str, str] = {}
    env = dict(os.environ)
    sems = semaphores()
    if native_bootstrap is not None:
        env["SGLANG_HOST_IP"] = "127.0.0.1"
        env["RADIX_GLOBAL_CPU_PATCH_MODULES"] = "sglang_patch.pd_cpu"
    try:
        for name in ("P", "D"):
            port = free_port()
            extra = ["--radix-global-pool-id", pool_id, "--radix-global-pool-capacity-gb", "0.2",
                     "--radix-global-namespace", str(NS), "--radix-global-worker-id", name]
            if native_bootstrap is not None:
                extra += ["--disaggregation-transfer-backend", "mooncake_tcp",
                          "--disaggregation-mode", "prefill" if name == "P" else "decode"]
                if name == "D":  # the wrapper's HiCache needs a radix cache on decode too
                    extra += ["--disaggregation-decode-enable-radix-cache"]
                if name == "P":
                    extra += ["--disaggregation-bootstrap-port", str(native_bootstrap)]
            tag = "native" if native_bootstrap else "pool"
            with open(run_dir / f"{name}-{tag}.log", "wb") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "sglang_patch.launch_server", "--model-path", model,
                     "--host", "127.0.0.1", "--port", str(port), *CPU_FLAGS, *extra],
                    stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
                    start_new_session=True, env=env)
            urls[name] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        for name, url in urls.items():
            while not _healthy(url):
                if procs[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {name} did not start; see {run_dir}")
                time.sleep(1.0)
        yield urls
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        # what the wrappers' engines left in /dev/shm (each wrapper stopped its own engine)
        sweep_semaphores(sems, groups=[proc.pid for proc in procs.values()])


class PoolProbe:
    def __init__(self, pool_id: str) -> None:
        self.pool_id = pool_id
        self.ids: dict[str, list[int]] = {}
        self.pool: Any = None

    def open(self) -> Any:
        from sglang_patch.pool.shm_pool import ShmPagePool

        if self.pool is None:
            self.pool = ShmPagePool.open_existing(self.pool_id)
        return self.pool

    async def pages_present(self, req: RouteRequest) -> int:
        pool, n = self.open(), 0
        for digest in keys.page_digests(self.ids[req.request_id], PAGE):
            if not pool.exists(f"{NS}/{digest.hex()}"):
                break
            n += 1
        return n

    def pages_moved(self) -> tuple[int, int]:
        """(pages stored, pages read) since the pool was created (all processes)."""
        s = self.open().stats()
        return s.stores, s.hits


def kv_bytes_per_token(model: str) -> int:
    """K and V of every layer, float32: what a prompt token's KV weighs on the wire."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return int(2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4)
