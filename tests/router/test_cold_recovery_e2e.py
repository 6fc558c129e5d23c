"""Cold recovery (issue 16, ``docs/interfaces.md``, "The persistent disk tier under the pool"): a
worker whose host lost its memory comes back warm from the pool's disk tier, on real SGLang CPU
workers.

The real router (in-process, conductor) and a worker started by ``radix-global sglang --pool-disk
DIR`` that registers with it. Four conversations get two turns through the router. Then the host
"reboots": worker and router stop, the shm pool is destroyed. A new router and a new worker with
the same disk folder start. Checks:

1. Before any request, the new router's index shows conversation 0's history on the disk holder
   (the backend announced the disk to the new subscriber).
2. Turn 3 of conversation 0 through the router: the conductor plans the fetch from the disk
   holder, the engine reports the history from storage, the output equals a cold run.
3. Conversation 1's page files were truncated on disk after the reboot: its turn 3 loads
   nothing from storage, recomputes, and its output still equals a cold run.
4. Negative control: the worker restarted without ``--pool-disk`` recomputes conversation 3's
   history (the storage assertion of check 2 fails on it).
5. A worker of a model with the same config but other weights (one byte of the weights file
   changed), on the same disk, never loads conversation 2's pages.
Checks 4 and 5 run on two sites started together (4's pool is an empty one of its own).
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_peer import ServerThread, registered_workers
from pd_workers import PAGE, Worker, prompt, spawn, stop, wait_healthy

from radix_global.keys import page_digests, page_keys
from radix_global.pool_ids import disk_holder
from radix_global.types import Namespace
from router.config import RouterConfig
from router.http.app import build_app
from router.state import RouterState
from sglang_patch.pool.disk_format import file_stem
from sglang_patch.pool.shm_pool import destroy_pool

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1500)]


def body(ids: list[int], n: int = 8, **extra: Any) -> dict[str, Any]:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0},
            **extra}


def storage(meta: dict[str, Any]) -> int:
    return int((meta.get("cached_tokens_details") or {}).get("storage") or 0)


def history_pages(ids: list[int]) -> int:
    """Full pages of a conversation's turns 1 and 2 (its last message and answer aside)."""
    return (len(ids) - 48 - 8) // PAGE


class Site:
    """One "host": a router in this process and one worker process on a pool and disk."""

    def __init__(self, model: Path, pool_id: str, disk: Path | None) -> None:
        self.state = RouterState(RouterConfig.from_options(profile_max_tokens=0,
                                                           health_check_interval_s=3600))
        self.router = ServerThread(build_app(self.state)).start()
        args = ["--radix-global", self.router.url, "--radix-global-pool-id", pool_id,
                "--radix-global-pool-capacity-gb", "0.2", "--radix-global-worker-id", "W"]
        self.worker: Worker = spawn("W", model, [*args, *(["--radix-global-pool-disk", str(disk)]
                                                          if disk else [])])
        self.client = httpx.Client(base_url=self.router.url, timeout=300)

    def ready(self) -> dict[str, Any]:
        wait_healthy([self.worker], 900)
        return registered_workers(self.client, 1)[0]

    def held(self, namespace: str, holder: str, ids: list[int]) -> int:
        match = self.state.index.view.match(Namespace(namespace), page_keys(ids, PAGE),
                                            self.state.clock())
        return max((m.pool for (h, _), m in match.matched.items() if h == holder), default=0)

    def wait_held(self, namespace: str, holder: str, ids: list[int], pages: int) -> None:
        deadline = time.monotonic() + 90
        while self.held(namespace, holder, ids) < pages:
            assert time.monotonic() < deadline, (holder, self.held(namespace, holder, ids))
            time.sleep(0.5)

    def close(self) -> None:
        stop(self.worker)
        self.client.close()
        self.router.stop()


def test_a_host_that_lost_its_memory_comes_back_warm_from_disk(tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    pool_id, disk = f"cr-{uuid.uuid4().hex[:8]}", tmp_path / "disk"
    site = Site(tiny_model_dir, pool_id, disk)
    try:
        info = site.ready()
        ns = info["namespace"]
        assert info["pool_disk_id"] == disk_holder(pool_id) and info["pool_disk_read_Bps"] > 0
        convos = []
        for c in range(4):  # two turns each, through the router
            ids = prompt([4000 + 10 * c + k for k in range(8)])
            for turn in range(2):
                r = site.client.post("/generate", json=body(ids))
                assert r.status_code == 200, r.text
                ids = [*ids, *r.json()["output_ids"], *prompt([4500 + 10 * c + turn])]
            convos.append(ids)  # history + turn 3's message
        for ids in convos:  # written through to disk (turn 2's answer aside)
            site.wait_held(ns, disk_holder(pool_id), ids, history_pages(ids))
    finally:
        site.close()
        destroy_pool(pool_id)  # the reboot: the host's memory is gone

    site = Site(tiny_model_dir, pool_id, disk)
    try:
        site.ready()
        history = history_pages(convos[0])
        # 1. announced before any request
        site.wait_held(ns, disk_holder(pool_id), convos[0], history)
        for i in range(len(convos[1]) // PAGE):  # 3. damage conversation 1 on disk
            d = page_digests(convos[1], PAGE)[i].hex()
            f = disk / (name := file_stem(f"{ns}/{d}"))[:2] / f"{name}.page"
            if f.exists():
                f.write_bytes(f.read_bytes()[:-7])
        direct = httpx.Client(base_url=site.worker.url, timeout=300)

        def cold(ids: list[int]) -> list[int]:
            r = direct.post("/generate", json=body(ids, cache_salt=uuid.uuid4().hex))
            assert r.json()["meta_info"]["cached_tokens"] == 0
            return list(r.json()["output_ids"])

        refs = [cold(ids) for ids in convos[:2]]
        # 2. turn 3 fetches the history from disk, planned by the conductor
        r = site.client.post("/generate", json=body(convos[0], rid="t3"))
        meta = r.json()["meta_info"]
        print("after the reboot, turn 3:", meta)
        assert storage(meta) >= history * PAGE, meta
        assert r.json()["output_ids"] == refs[0]
        decision = next(x for x in reversed(site.client.get("/admin/stats").json()["recent"])
                        if x.get("client_request_id") == "t3")
        assert decision["fetch_tokens"] >= history * PAGE, decision
        r = site.client.post("/generate", json=body(convos[1]))
        meta = r.json()["meta_info"]
        print("damaged on disk:", meta)
        assert storage(meta) == 0 and r.json()["output_ids"] == refs[1]
    finally:
        site.close()
        destroy_pool(pool_id)

    # 4 and 5 start together (one start-up's wait for both). 4. negative control: the same
    # reboot without the disk tier (an empty pool of its own); 5. same config, other weights,
    # same disk: nothing loads
    other = tmp_path / "other-weights"
    shutil.copytree(tiny_model_dir, other)
    weights = other / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    sites: list[Site] = []
    try:
        sites.append(plain := Site(tiny_model_dir, f"{pool_id}-nodisk", None))
        sites.append(reweighted := Site(other, pool_id, disk))
        plain.ready()
        r = plain.client.post("/generate", json=body(convos[3]))
        print("without the disk tier:", r.json()["meta_info"])
        assert storage(r.json()["meta_info"]) == 0
        assert reweighted.ready()["namespace"] != ns
        r = httpx.post(reweighted.worker.url + "/generate", json=body(convos[2]), timeout=300)
        print("other weights:", r.json()["meta_info"])
        assert storage(r.json()["meta_info"]) == 0
    finally:
        for site in sites:
            site.close()
        destroy_pool(f"{pool_id}-nodisk")
        destroy_pool(pool_id)
