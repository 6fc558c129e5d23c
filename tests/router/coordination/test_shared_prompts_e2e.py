"""A platform prompt registered on one router is shared by tenants routed through the other, on
a real SGLang CPU worker (``docs/interfaces.md``, "Several routers, one view"; the sharing
itself: interfaces.md, "Shared platform prefixes across isolated tenants").

Two routers (in-process, conductor, the same tenants file) over a real Redis, and one worker
given both (``--radix-global http://A,http://B``): it registers with A, and its pool backend
asks A which of its salted keys are a shared prefix's canonical pages. The prefix is registered
on A; tenant X's first request goes through B, which keys it and records the alias, so A learns
the alias only from the service. Tenant Y, through A, then reuses exactly the prefix from the
pool and its output equals a cold run. Negative control: with A's lookup in the service off,
the same steps with another prefix give Y nothing cached.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_peer import ServerThread
from pd_workers import PAGE, prompt, spawn, stop, wait_healthy
from redis_server import RedisServer

from radix_global.keys import page_keys
from radix_global.types import Namespace, PoolId
from router.config import RouterConfig
from router.http.app import build_app
from router.state import RouterState
from sglang_patch.pool.shm_pool import destroy_pool

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1200)]
NS = "tiny@shared2"


def body(ids: list[int], n: int = 6) -> dict[str, Any]:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0}}


def meta(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return dict(r.json()["meta_info"])


def wait_in_pool(state: RouterState, pool: PoolId, keys: list[Any], what: str) -> None:
    deadline = time.monotonic() + 90
    held = 0
    while time.monotonic() < deadline:
        match = state.index.view.match(Namespace(NS), keys, state.clock())
        held = max((m.pool for (h, _), m in match.matched.items() if h == pool), default=0)
        if held == len(keys):
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: {held} of {len(keys)} pages in the pool")


def test_a_prompt_registered_on_one_router_is_shared_through_the_other(
        tiny_model_dir: Path, tmp_path: Path, redis_server: RedisServer) -> None:
    pool_id = f"shp2-{uuid.uuid4().hex[:8]}"
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("".join(f'[tenants.{t}]\napi_keys = ["k-{t}"]\n' for t in "xyuv"))
    states = [RouterState(RouterConfig.from_options(
        profile_max_tokens=0, health_check_interval_s=3600, tenants_file=str(tenants),
        coordination_url=redis_server.url, coordination_router_id=name,
        coordination_resync_s=0.3)) for name in "AB"]
    routers = [ServerThread(build_app(s)).start() for s in states]
    a, b = states
    worker = spawn("W", tiny_model_dir, [
        "--radix-global", f"{routers[0].url},{routers[1].url}",
        "--radix-global-pool-id", pool_id, "--radix-global-pool-capacity-gb", "0.2",
        "--radix-global-namespace", NS, "--radix-global-worker-id", "W"])
    clients = [httpx.Client(base_url=r.url, timeout=httpx.Timeout(300, connect=5))
               for r in routers]
    try:
        wait_healthy([worker], 900)
        deadline = time.monotonic() + 60
        while not (a.registry.find("W") and b.registry.find("W")):
            assert time.monotonic() < deadline, "the worker on both routers"
            time.sleep(0.2)
        direct = httpx.Client(base_url=worker.url, timeout=300)

        def as_tenant(router: int, t: str, ids: list[int]) -> httpx.Response:
            return clients[router].post("/generate", json=body(ids),
                                        headers={"Authorization": f"Bearer k-{t}"})

        def cold(ids: list[int]) -> list[int]:
            r = direct.post("/generate", json={**body(ids),
                                               "cache_salt": f"cold-{uuid.uuid4().hex}"})
            assert meta(r)["cached_tokens"] == 0
            return list(r.json()["output_ids"])

        def share(name: str, prefix: list[int], first: str, second: str, shared: bool
                  ) -> dict[str, Any]:
            """Register ``prefix`` on A, ``first`` sends it through B, ``second`` through A
            (``shared``: once the canonical pages are in the pool)."""
            r = clients[0].post("/admin/shared-prefixes", json={
                "name": name, "model": a.registry.get("W").info.model, "token_ids": prefix})
            assert r.status_code == 201, r.text
            deadline = time.monotonic() + 10
            while name not in {s.name for s in b.shared_prefixes.specs()}:
                assert time.monotonic() < deadline, "the prefix on router B"
                time.sleep(0.1)
            time.sleep(2.5)  # a backend that saw no prefix registered waits 2 s to ask again
            mine, theirs = prompt([9100, len(name)]), prompt([9200, len(name)])
            assert meta(as_tenant(1, first, [*prefix, *mine]))["cached_tokens"] == 0
            if shared:
                wait_in_pool(a, PoolId(pool_id), page_keys(prefix, PAGE), "canonical pages")
            else:
                time.sleep(5)  # as long as the pool writes take when they come
            ids = [*prefix, *theirs]
            reference = cold(ids)
            got = as_tenant(0, second, ids)
            assert got.json()["output_ids"] == reference
            return meta(got)

        prefix = prompt(list(range(4000, 4012)))  # 576 tokens: 144 pages
        m = share("agent", prefix, "x", "y", shared=True)
        assert m["cached_tokens"] == len(prefix), m
        # negative control: A does not ask the service, so the worker never hears the alias
        writes = a.view.writes
        assert writes is not None

        async def nothing(*args: Any) -> bool:
            return False

        writes.alias_lookup = nothing  # type: ignore[method-assign]
        other = prompt(list(range(5000, 5012)))
        m = share("other", other, "u", "v", shared=False)
        print("negative control, alias known to B only:", m)
        assert m["cached_tokens"] == 0, m
    finally:
        for c in clients:
            c.close()
        stop(worker)
        for r in routers:
            r.stop()
        destroy_pool(pool_id)
