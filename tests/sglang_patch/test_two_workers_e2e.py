"""Two real SGLang workers (CPU) started by `radix-global sglang` share KV through the L3 pool.

One scenario (server start-ups are minutes on a shared 2-core box; at most 2 SGLang at a time):

1. Worker A (wrapper, ``--radix-global`` = a registration peer below) serves prompt P; its pages
   reach the pool (write-through) and the pool's events reach a real ``GlobalIndex`` (POOL hits).
2. Worker B: P + a new turn with another tenant's ``cache_salt`` gets no pool hit (tenants apart);
   unsalted, B serves the shared prefix from the pool (``cached_tokens_details.storage``).
3. A's engine is killed: A is deregistered; B (cache flushed) still serves P from the pool, same
   output.
4. Every page in the pool is corrupted: B (flushed) detects it by checksum, recomputes, and gives
   the same output.
5. Cold reference (plain SGLang, ``--disable-radix-cache``) equals B's output token for token;
   and a worker with verification switched off (``RADIX_GLOBAL_POOL_NO_VERIFY=1``, test only)
   over a corrupted pool gives a different output: the comparison can fail.

The registration peer is a tiny Starlette app speaking the protocol of docs/interfaces.md,
"Worker registration" (router/http/app.py is the real implementation); it decodes records with the
real ``WorkerInfo``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from pd_workers import Worker, spawn, wait_healthy
from servers import free_port, sglang_server
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from waits import until

from radix_global import keys, trace
from radix_global.registration import RegistrationError, WorkerInfo, decode_worker_info
from sglang_patch import cpu_compat
from sglang_patch.pool.shm_pool import NO_VERIFY_ENV, ShmPagePool, destroy_pool

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]

TOKEN = "test-admin-token"
PAGE = 4
CPU_FLAGS = [*cpu_compat.CPU_SERVER_FLAGS, "--dtype", "float32",
             "--max-total-tokens", "8192", "--page-size", str(PAGE), "--hicache-ratio", "2",
             "--hicache-storage-prefetch-policy", "wait_complete"]


class RegistrationPeer:
    """Records /admin/workers calls; refuses a wrong token (401) and a bad record (400)."""

    def __init__(self) -> None:
        self.workers: dict[str, WorkerInfo] = {}
        self.calls: list[tuple[str, str]] = []
        app = Starlette(routes=[
            Route("/admin/workers", self._register, methods=["POST"]),
            Route("/admin/workers/{wid}/heartbeat", self._heartbeat, methods=["POST"]),
            Route("/admin/workers/{wid}", self._delete, methods=["DELETE"]),
        ])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                     log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def _authorized(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {TOKEN}"

    async def _register(self, request: Request) -> JSONResponse:
        if not self._authorized(request):
            return JSONResponse({"error": "unauthorized"}, 401)
        try:
            info = decode_worker_info(await request.body())
        except RegistrationError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        self.workers[info.worker_id] = info
        self.calls.append(("register", info.worker_id))
        return JSONResponse({"worker_id": info.worker_id}, 201)

    async def _heartbeat(self, request: Request) -> JSONResponse:
        wid = request.path_params["wid"]
        self.calls.append(("heartbeat", wid))
        return JSONResponse({}, 200 if wid in self.workers else 404)

    async def _delete(self, request: Request) -> JSONResponse:
        wid = request.path_params["wid"]
        self.calls.append(("delete", wid))
        return JSONResponse({}, 200 if self.workers.pop(wid, None) else 404)

    def __enter__(self) -> RegistrationPeer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def _kill_tree(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def wrapper_worker(model: Path, args: list[str], env: dict[str, str] | None = None,
                   timeout: float = 600) -> Iterator[Worker]:
    """`python -m sglang_patch.launch_server ...`, healthy, then SIGTERM (wrapper deregisters)."""
    w = spawn("wrapper", model, args, flags=CPU_FLAGS, env=env)
    proc = w.proc
    descendants: list[int] = []
    try:
        wait_healthy([w], timeout)
        descendants = w.engine_pids()
        yield w
    finally:
        descendants += w.engine_pids()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
        _kill_tree(descendants)


wait_until = partial(until, timeout_s=60.0, every_s=0.2)


def generate(url: str, ids: list[int], salt: str | None = None, n: int = 12) -> dict[str, Any]:
    body: dict[str, Any] = {"input_ids": ids,
                            "sampling_params": {"max_new_tokens": n, "temperature": 0.0}}
    if salt:
        body["cache_salt"] = salt
    resp = httpx.post(url + "/generate", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def storage_tokens(out: dict[str, Any]) -> int:
    details = out["meta_info"].get("cached_tokens_details") or {}
    return int(details.get("storage") or 0)


def flush(url: str) -> None:
    assert httpx.post(url + "/flush_cache", timeout=60).status_code == 200


def wait_pool_pages(pool_id: str, at_least: int, timeout: float = 120) -> ShmPagePool:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            pool = ShmPagePool.open_existing(pool_id)
            if pool.stats().pages >= at_least:
                return pool
            pool.close()
        assert time.monotonic() < deadline, f"pool {pool_id} never held {at_least} pages"
        time.sleep(0.5)


def wait_prompt_in_pool(pool: ShmPagePool, namespace: str, ids: list[int],
                        timeout: float = 120) -> None:
    wanted = [f"{namespace}/{d.hex()}" for d in keys.page_digests(ids, PAGE)]
    deadline = time.monotonic() + timeout
    while not all(pool.exists(k) for k in wanted):
        assert time.monotonic() < deadline, "the prompt's pages never (re)appeared in the pool"
        time.sleep(0.5)


def corrupt_all(pool: ShmPagePool) -> int:
    rng = np.random.default_rng(7)
    where = pool.valid_keys_locations()
    for path, offset, length in where:
        noise = (rng.standard_normal(length // 4) * 50).astype(np.float32).tobytes()
        with open(path, "r+b") as fh:
            fh.seek(offset)
            fh.write(noise)
    return len(where)


def index_subscriber(endpoint: str, pool_id: str, namespace: str) -> tuple[Any, Any]:
    """A real GlobalIndex fed by the pool's events through the real decoder."""
    import zmq

    from radix_global.events import EventDecoder
    from radix_global.index import GlobalIndex
    from radix_global.types import Namespace, PoolId

    index = GlobalIndex()
    index.register_namespace(Namespace(namespace), PAGE)
    decoder = EventDecoder(PoolId(pool_id), Namespace(namespace), PAGE)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            if sub.poll(200):
                _topic, _seq, payload = sub.recv_multipart()
                for op in decoder.decode(payload).ops:
                    index.apply(op)
        sub.close(0)

    threading.Thread(target=loop, daemon=True).start()
    return index, stop


@pytest.mark.timeout(3000)  # three waves of server start-ups: minutes each on a shared box
def test_two_workers_share_prefix_through_pool(tiny_model_dir: Path) -> None:
    pool_id = f"e2e-{uuid.uuid4().hex[:8]}"
    pool_args = ["--radix-global", "", "--radix-global-admin-token", TOKEN,
                 "--radix-global-pool-id", pool_id, "--radix-global-pool-capacity-gb", "0.05",
                 "--radix-global-heartbeat-interval-s", "1"]
    # 1,280 tokens (trace lengths count 512 tokens per hash id; scaled to 64): well above SGLang's
    # storage prefetch threshold (256 tokens), below which it never asks the pool.
    prompt = trace.synthesize_prompt(list(range(500, 520)), 20 * 512, 64)
    turn = [*prompt, *trace.synthesize_prompt([9001, 9002], 2 * 512, 64)]
    assert len(prompt) == 1280 and len(turn) == 1408
    prompt_pages = len(prompt) // PAGE
    try:
        with RegistrationPeer() as peer:
            pool_args[1] = peer.url
            with wrapper_worker(tiny_model_dir, [
                    *pool_args, "--radix-global-worker-id", "A",
                    "--radix-global-pool-load-probe-tokens", "512"]) as a:
                wait_until(lambda: "A" in peer.workers, "A's registration")  # after /health
                info = peer.workers["A"]
                assert info.pool_id == pool_id and info.page_size == PAGE
                assert info.kv_events_endpoint and info.pool_events_endpoint
                # the wrapper timed its engine's load path from the pool before it registered:
                # a CPU engine takes a run in at MB/s, far below any link (docs/benchmarks.md)
                assert info.pool_load_Bps is not None and 1e5 < info.pool_load_Bps < 1e10, info
                # half its host tier, read from the engine's /server_info (interfaces.md,
                # "Worker registration")
                assert info.pool_prefetch_budget_tokens > 0, info
                index, stop_index = index_subscriber(info.pool_events_endpoint, pool_id,
                                                     info.namespace)
                time.sleep(1.0)  # SUB joins before the first publish
                generate(a.url, prompt)
                pool = wait_pool_pages(pool_id, prompt_pages - 1)
                wait_prompt_in_pool(pool, info.namespace, prompt)  # our keys = SGLang's keys
                from radix_global.types import Namespace

                deadline = time.monotonic() + 30
                while True:  # the pool's events made the index see the prefix at tier POOL
                    match = index.match(Namespace(info.namespace),
                                        keys.page_keys(prompt, PAGE), time.time())
                    pool_hit = max((m.pool for (h, _), m in match.matched.items()
                                    if h == pool_id), default=0)
                    if pool_hit >= prompt_pages - 1 or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                stop_index.set()
                assert pool_hit >= prompt_pages - 1, match

                with wrapper_worker(tiny_model_dir,
                                    [*pool_args, "--radix-global-worker-id", "B"]) as b:
                    wait_until(lambda: "B" in peer.workers, "B's registration")
                    assert peer.workers["B"].pool_load_Bps is None  # the default: no probe
                    salted = generate(b.url, turn, salt="tenant-b")
                    assert storage_tokens(salted) == 0  # another tenant never reads A's pages
                    flush(b.url)
                    warm = generate(b.url, turn)
                    assert storage_tokens(warm) >= (prompt_pages - 2) * PAGE, warm["meta_info"]
                    assert warm["output_ids"] == salted["output_ids"]

                    # 3. A's engine dies: A leaves the registry, the pool's pages stay usable.
                    _kill_tree(a.engine_pids())
                    a.proc.wait(timeout=60)
                    assert ("delete", "A") in peer.calls and "A" not in peer.workers
                    wait_until(lambda: ("heartbeat", "B") in peer.calls, "B's heartbeat")
                    flush(b.url)
                    after_a = generate(b.url, turn)
                    assert storage_tokens(after_a) >= (prompt_pages - 2) * PAGE
                    assert after_a["output_ids"] == warm["output_ids"]

                    # 4. Corrupted pool: caught by checksum, recomputed, same output.
                    assert corrupt_all(pool) >= prompt_pages
                    bad_before = pool.stats().checksum_failures
                    flush(b.url)
                    caught = generate(b.url, turn)
                    assert pool.stats().checksum_failures > bad_before
                    assert storage_tokens(caught) < (prompt_pages - 2) * PAGE
                    assert caught["output_ids"] == warm["output_ids"]
                    wait_prompt_in_pool(pool, info.namespace, prompt)  # B rewrote good pages
                assert ("delete", "B") in peer.calls

            # 5. Cold reference and the negative control, side by side (2 servers).
            corrupt_all(pool)
            with wrapper_worker(tiny_model_dir, ["--radix-global-pool-id", pool_id,
                                                 "--radix-global-pool-capacity-gb", "0.05"],
                                env={NO_VERIFY_ENV: "1"}) as nv, \
                    sglang_server(tiny_model_dir, ["--page-size", str(PAGE),
                                                   "--disable-radix-cache"]) as cold:
                reference = generate(cold.url, turn)
                unverified = generate(nv.url, turn)
            assert reference["output_ids"] == warm["output_ids"]
            assert storage_tokens(unverified) >= (prompt_pages - 2) * PAGE
            assert unverified["output_ids"] != reference["output_ids"], (
                "corrupted KV served without verification should change the output")
    finally:
        destroy_pool(pool_id)
