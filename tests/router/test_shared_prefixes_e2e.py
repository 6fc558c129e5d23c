"""A registered platform prompt shared across isolated tenants, and nothing else shared, on a
real SGLang CPU worker (``docs/interfaces.md``, "Shared platform prefixes across isolated tenants").

The real router (``build_app`` under uvicorn on loopback, conductor, a tenants file with
isolated tenants) and one worker started by ``radix-global sglang`` that registers with it (its
pool backend asks the router for aliases). Requests go through the router with ``/generate``
token ids, greedy. The worker runs the start-up load probe (``--pool-load-probe-tokens``), whose
pool writes come before any prefix is registered. P is a 1,056-token platform prompt (264 pages
of 4), registered through the admin API; the cold references are computed on the worker
directly, under salts of their own.
Checks:

1. Tenant A's first request P + A's message computes everything. Once the index shows P's
   canonical pages in the pool, tenant B's P + B's message reuses exactly P: the engine reports
   1,056 cached tokens, all from storage; the router predicted the fetch; the output equals a
   cold run.
2. B sends A's exact conversation: it reuses P only (1,056 cached, never A's message), the
   output equals a cold run, and its ``x-radix-*`` headers equal those of an unseen
   conversation of B's (the engine rid aside).
3. An unregistered common prefix Q of A and B is not shared (B gets 0 cached).
4. B naming A's namespace as its ``cache_salt`` (narrowed to B's own) and A's ``rid`` still
   reuses P only. With P deleted from the registry, a new tenant E recomputes P (the sharing
   is the registration's, not an accident of the keys).
5. Negative control: with the boundary rule off (the router's share-past-prefix switch, tenants
   C and D so that no cached alias answer stands in the way), D reuses C's message as well: the
   "P only" assertion of checks 2 and 4 fails on it.
6. Warming stays in the tenant's namespace (issue 35, item 1): the router's warm request for a
   prefix remembered from isolated tenant Z's traffic leaves it where Z's requests find it (Z's
   salt: all cached) and where no other client does (no salt: 0 cached). Negative control: the
   same request without the scope (as warming sent it before) makes Z's prompt a hit for any
   client.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_peer import ServerThread, registered_workers
from pd_workers import PAGE, Worker, prompt, spawn, stop, wait_healthy

from radix_global.keys import page_keys
from radix_global.types import Namespace, PoolId
from router.cluster.prefix_tokens import SHARED, Remembered, WarmScope
from router.cluster.warming import HotPrefixWarmer
from router.config import RouterConfig
from router.http.app import build_app
from router.state import RouterState
from sglang_patch.pool.shm_pool import destroy_pool

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1200)]

NS = "tiny@shared"
TENANTS = ("a", "b", "c", "d", "e")
P = prompt(list(range(3000, 3022)))  # 1,056 tokens: 264 full pages


def body(ids: list[int], n: int = 8, **extra: Any) -> dict[str, Any]:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0},
            **extra}


def meta(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return dict(r.json()["meta_info"])


def storage(m: dict[str, Any]) -> int:
    return int((m.get("cached_tokens_details") or {}).get("storage") or 0)


def radix_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items()
            if k.startswith("x-radix-") and k != "x-radix-request-id"}


def test_platform_prompt_shared_tenant_content_isolated(tiny_model_dir: Path,
                                                        tmp_path: Path) -> None:
    pool_id = f"shp-{uuid.uuid4().hex[:8]}"
    tenants = tmp_path / "tenants.toml"
    tenants.write_text("".join(f'[tenants.{t}]\napi_keys = ["k-{t}"]\n' for t in TENANTS))
    config = RouterConfig.from_options(profile_max_tokens=0, health_check_interval_s=3600,
                                       tenants_file=str(tenants))
    state = RouterState(config)
    router = ServerThread(build_app(state)).start()
    worker = spawn("W", tiny_model_dir, [
        "--radix-global", router.url, "--radix-global-pool-id", pool_id,
        "--radix-global-pool-capacity-gb", "0.2", "--radix-global-namespace", NS,
        "--radix-global-worker-id", "W", "--radix-global-pool-load-probe-tokens", "512"])
    try:
        wait_healthy([worker], 900)
        with httpx.Client(base_url=router.url, timeout=httpx.Timeout(300, connect=5)) as c:
            _scenario(c, state, worker, PoolId(pool_id))
    finally:
        stop(worker)
        router.stop()
        destroy_pool(pool_id)


def _wait_in_pool(state: RouterState, pool: PoolId, keys: list[Any], what: str) -> None:
    """Until the router's index shows ``keys`` in the pool (write-through is asynchronous)."""
    deadline = time.monotonic() + 90
    held = 0
    while time.monotonic() < deadline:
        match = state.index.view.match(Namespace(NS), keys, state.clock())
        held = max((m.pool for (h, _), m in match.matched.items() if h == pool), default=0)
        if held == len(keys):
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: {held} of {len(keys)} pages in the pool")


def _scenario(c: httpx.Client, state: RouterState, w: Worker, pool: PoolId) -> None:
    info = registered_workers(c, 1)[0]
    assert info["pool_aliases"] is True, info
    direct = httpx.Client(base_url=w.url, timeout=300)

    def as_tenant(t: str, ids: list[int], **extra: Any) -> httpx.Response:
        return c.post("/generate", json=body(ids, **extra),
                      headers={"Authorization": f"Bearer k-{t}"})

    def cold(ids: list[int]) -> list[int]:
        r = direct.post("/generate", json=body(ids, cache_salt=f"cold-{uuid.uuid4().hex}"))
        assert meta(r)["cached_tokens"] == 0
        return list(r.json()["output_ids"])

    a_msg, b_msg, d_new = prompt([3100, 3101]), prompt([3200, 3201]), prompt([3300, 3301])
    a1, b1 = [*P, *a_msg], [*P, *b_msg]
    r = c.post("/admin/shared-prefixes", json={"name": "agent", "model": info["model"],
                                               "token_ids": P})
    assert r.status_code == 201, r.text
    # The start-up load probe's pages were written while no prefix was registered, so the
    # backend stopped asking for 2 s (interfaces.md,
    # "Shared platform prefixes across isolated tenants"): a prefix registered since is shared after
    # that.
    time.sleep(2.5)
    refs = {name: cold(ids) for name, ids in (("a1", a1), ("b1", b1))}  # not through the router
    canonical = page_keys(P, PAGE)

    # 1. A computes P; B reuses exactly P, from the pool, and the router predicted it.
    assert meta(as_tenant("a", a1))["cached_tokens"] == 0
    _wait_in_pool(state, pool, canonical, "P after A's request")
    r = as_tenant("b", b1, rid="b1")
    m = meta(r)
    print("B's first request:", m, radix_headers(r))
    assert m["cached_tokens"] == len(P) and storage(m) == len(P), m
    assert r.json()["output_ids"] == refs["b1"]
    decision = next(x for x in reversed(c.get("/admin/stats").json()["recent"])
                    if x.get("client_request_id") == "b1")
    assert decision["fetch_tokens"] == len(P), decision
    # docs/interfaces.md, "The reuse breakdown": "late" reads it
    assert r.headers["x-radix-fetch-tokens"] == str(len(P)), r.headers

    # 2. B sends A's exact conversation: P only; headers as for an unseen conversation.
    seen = as_tenant("b", a1)
    assert meta(seen)["cached_tokens"] == len(P), meta(seen)
    assert seen.json()["output_ids"] == refs["a1"]
    unseen = as_tenant("b", [*P, *d_new])
    assert meta(unseen)["cached_tokens"] == len(P)
    assert radix_headers(seen) == radix_headers(unseen), (seen.headers, unseen.headers)

    # 3. A common prefix nobody registered stays each tenant's own.
    q = prompt(list(range(3400, 3410)))
    assert meta(as_tenant("a", [*q, *a_msg]))["cached_tokens"] == 0
    _wait_in_pool(state, pool, page_keys([*q, *a_msg], PAGE, cache_salt="tenant:a"),
                  "A's unregistered prefix")
    assert meta(as_tenant("b", [*q, *b_msg]))["cached_tokens"] == 0

    # 4. A client salt naming A's namespace, and A's rid: still P only.
    m = meta(as_tenant("b", a1, cache_salt="tenant:a", rid="a1"))
    assert m["cached_tokens"] == len(P) and storage(m) == len(P), m

    # The sharing is the registration's: with P deleted, a new tenant E recomputes it.
    assert c.delete("/admin/shared-prefixes/agent").status_code == 200
    assert meta(as_tenant("e", [*P, *b_msg]))["cached_tokens"] == 0
    assert c.post("/admin/shared-prefixes", json={"name": "agent", "model": info["model"],
                                                  "token_ids": P}).status_code == 201
    # with no prefix registered the backend stopped asking for 2 s (docs/interfaces.md,
    # "Shared platform prefixes across isolated tenants")
    time.sleep(2.5)

    # 5. Negative control: share past the prefix, and D gets C's message too.
    state.shared_prefixes.share_past_prefix = True
    c_msg = prompt([3500, 3501, 3502])
    c1 = [*P, *c_msg]
    as_tenant("c", c1)
    _wait_in_pool(state, pool, page_keys(c1, PAGE), "C's whole request, shared")
    m = meta(as_tenant("d", c1))
    print("negative control, D sends C's conversation:", m)
    assert m["cached_tokens"] > len(P), m  # what checks 2 and 4 refuse
    state.shared_prefixes.share_past_prefix = False

    # 6. A warm request carries the namespace of the prefix it warms.
    def warm(ids: list[int], scope: WarmScope) -> None:
        async def send() -> bool:
            async with httpx.AsyncClient() as client:
                warmer = HotPrefixWarmer(state.index, state.registry, client, lambda slot: 0)
                return await warmer._send(w.url, 1, 0, Remembered(ids, scope))
        assert asyncio.run(send())

    z, leaked = prompt([3700, 3701]), prompt([3800, 3801])
    warm(z, WarmScope("tenant:z", None))
    shared_view = meta(direct.post("/generate", json=body(z)))
    tenant_view = meta(direct.post("/generate", json=body(z, cache_salt="tenant:z")))
    print("warmed in Z's namespace: shared client", shared_view["cached_tokens"], "Z",
          tenant_view["cached_tokens"])
    assert shared_view["cached_tokens"] == 0, shared_view
    assert tenant_view["cached_tokens"] >= len(z) - PAGE, tenant_view
    warm(leaked, SHARED)  # negative control: the scope left out
    m = meta(direct.post("/generate", json=body(leaked)))
    assert m["cached_tokens"] >= len(leaked) - PAGE, m
