"""Mooncake Conductor's indexer API over an in-process ServiceState
(``radix_global/conductor_api.py``, ``docs/interfaces.md``, "Mooncake Conductor's indexer API"):
register, query (equal to the index's own match), tenant/LoRA scoping, bad input (4xx, never 500),
auth, and the served uvicorn task."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from radix_global.conductor_api import ConductorAPI, conductor_api
from radix_global.conductor_mapping import NO_URL, rank0_endpoint
from radix_global.conductor_wire import ADMIN_BODY_MAX_BYTES
from radix_global.index import GlobalIndex
from radix_global.keys import lora_extra_key, page_keys
from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.service_state import ServiceState
from radix_global.types import Location, Namespace, PoolId, Tier, WorkerId
from sglang_patch.ports import free_port

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
PS = 4
TOKENS = list(range(100, 124))  # 6 pages
TOKEN = "s3cret"


def reg_body(instance: str = "sgl-a", **kw: Any) -> dict[str, Any]:
    body = {"endpoint": f"tcp://127.0.0.1:{kw.pop('port', 31999)}", "type": "SGLang",
            "modelname": "tiny", "lora_name": "", "tenant_id": "default",
            "instance_id": instance, "block_size": PS, "dp_rank": 0, "additionalsalt": ""}
    body.update(kw)
    return body


class Fixture:
    def __init__(self, state: ServiceState, api: ConductorAPI, client: httpx.AsyncClient):
        self.state, self.api, self.client = state, api, client

    def store(self, wid: str, tokens: list[int], tier: Tier = Tier.GPU, rank: int = 0,
              ns: str = "tiny@0", **kw: Any) -> None:
        keys = page_keys(tokens, PS, **kw)
        self.state.index.apply(StorePages(Namespace(ns), Location(WorkerId(wid), rank, tier),
                                          None, keys))

    async def query(self, **kw: Any) -> httpx.Response:
        body = {"model": "tiny", "token_ids": TOKENS, "block_size": PS, **kw}
        return await self.client.post("/query", json=body)


def _client(api: ConductorAPI, peer: str = "127.0.0.1", **kw: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=api.app, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://conductor", **kw)


@pytest_asyncio.fixture
async def fx() -> AsyncIterator[Fixture]:
    state = ServiceState(GlobalIndex(), heartbeat_timeout_s=3600)
    api = ConductorAPI(state)
    async with _client(api) as client:
        try:
            yield Fixture(state, api, client)
        finally:
            await state.subscriber.close()


async def test_register_maps_onto_a_worker_registration(fx: Fixture) -> None:
    r = await fx.client.post("/register", json=reg_body())
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "registered successfully", "instance_id": "sgl-a",
                        "namespace": "tiny@0", "dp_size": 1, "subscribed": True}
    info = fx.state.workers[WorkerId("sgl-a")]
    assert info == WorkerInfo(worker_id="sgl-a", url=NO_URL, model="tiny", namespace="tiny@0",
                              page_size=PS, engine="sglang",
                              kv_events_endpoint="tcp://127.0.0.1:31999", kv_events_topic="")
    # additionalsalt is the namespace version; a hub path's '/' becomes '-'
    r = await fx.client.post("/register", json=reg_body(
        "vl-b", type="vLLM", modelname="org/m", additionalsalt="w8a8", port=31990,
        replay_endpoint="tcp://127.0.0.1:31980", url="http://127.0.0.1:8000", topic="kv"))
    assert r.status_code == 200, r.text
    info = fx.state.workers[WorkerId("vl-b")]
    assert (info.namespace, info.engine, info.url, info.kv_events_topic,
            info.kv_events_replay_endpoint) == ("org-m@w8a8", "vllm", "http://127.0.0.1:8000",
                                                "kv", "tcp://127.0.0.1:31980")


async def test_dp_ranks_register_one_by_one_and_unregister(fx: Fixture) -> None:
    # rank r publishes at rank 0's port + r: one worker with dp_size = highest rank + 1
    for rank in (0, 1):
        r = await fx.client.post("/register", json=reg_body(port=31000 + rank, dp_rank=rank))
        assert r.status_code == 200, r.text
    info = fx.state.workers[WorkerId("sgl-a")]
    assert (info.dp_size, info.kv_events_endpoint) == (2, "tcp://127.0.0.1:31000")
    # a rank whose endpoint is not at the layout's place: refused, nothing changes
    r = await fx.client.post("/register", json=reg_body(port=31500, dp_rank=2))
    assert r.status_code == 409 and r.json()["reason"] == "id_conflict"
    assert fx.state.workers[WorkerId("sgl-a")].dp_size == 2
    r = await fx.client.post("/unregister", json={"instance_id": "sgl-a", "dp_rank": 1,
                                                  "type": "SGLang", "modelname": "tiny"})
    assert r.json() == {"status": "unregistered successfully",
                        "removed_instances": ["sgl-a|default|1"]}
    assert fx.state.workers[WorkerId("sgl-a")].dp_size == 1
    r = await fx.client.post("/unregister", json={"instance_id": "sgl-a", "dp_rank": 1})
    assert r.status_code == 404
    r = await fx.client.post("/unregister", json={"instance_id": "sgl-a", "dp_rank": 0,
                                                  "tenant_id": "other"})
    assert r.status_code == 404  # the key is (instance, tenant, rank)
    r = await fx.client.post("/unregister", json={"instance_id": "sgl-a", "dp_rank": 0})
    assert r.status_code == 200 and WorkerId("sgl-a") not in fx.state.workers


async def test_query_equals_the_index_match_per_tier_and_rank(fx: Fixture) -> None:
    assert (await fx.client.post("/register", json=reg_body(dp_rank=1, port=31001))
            ).status_code == 200
    pool_worker = reg_body("sgl-b", port=31100)
    assert (await fx.client.post("/register", json=pool_worker)).status_code == 200
    fx.store("sgl-a", TOKENS[:8], Tier.GPU, rank=0)  # 2 pages on GPU of rank 0
    fx.store("sgl-a", TOKENS[:16], Tier.HOST, rank=0)  # 4 pages on rank 0's host tier
    fx.store("sgl-a", TOKENS[:20], Tier.GPU, rank=1)  # 5 pages on rank 1's GPU
    r = await fx.query()
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["default"]
    keys = page_keys(TOKENS, PS)
    m = fx.state.index.match(Namespace("tiny@0"), keys, fx.state.clock())
    r0, r1 = m.matched[(WorkerId("sgl-a"), 0)], m.matched[(WorkerId("sgl-a"), 1)]
    assert body["default"]["sgl-a"] == {
        "longest_matched": max(r0.pool, r1.pool) * PS,  # 20
        "GPU": max(r0.gpu, r1.gpu) * PS, "CPU": max(r0.host, r1.host) * PS,
        "DISK": max(r0.pool, r1.pool) * PS, "DP": {"0": r0.pool * PS, "1": r1.pool * PS}}
    assert body["default"]["sgl-a"]["longest_matched"] == 20 == m.best_pages * PS
    assert body["default"]["sgl-b"] == {"longest_matched": 0, "GPU": 0, "CPU": 0, "DISK": 0,
                                        "DP": {}}  # a candidate with nothing cached
    # instance_id narrows; a partial trailing page is not keyed
    r = await fx.query(instance_id="sgl-b")
    assert list(r.json()["default"]) == ["sgl-b"]
    r = await fx.query(token_ids=TOKENS[:23], instance_id="sgl-a")
    assert r.json()["default"]["sgl-a"]["longest_matched"] == 20
    # another model or block size: no candidates
    assert (await fx.query(model="other")).json() == {"default": {}}
    assert (await fx.query(block_size=8)).json() == {"default": {}}


async def test_pool_pages_count_for_the_workers_that_read_the_pool(fx: Fixture) -> None:
    info = WorkerInfo(worker_id="w-pool", url="http://127.0.0.1:1", model="tiny",
                      namespace="tiny@0", page_size=PS, pool_id="shm-1")
    await fx.state.register(info)  # through the admin path: tenant "default"
    fx.store(PoolId("shm-1"), TOKENS[:12], Tier.POOL)
    hit = (await fx.query()).json()["default"]["w-pool"]
    assert hit == {"longest_matched": 12, "GPU": 0, "CPU": 0, "DISK": 12, "DP": {"0": 12}}
    # an admin-API worker is not the API's to unregister, nor its id to take
    r = await fx.client.post("/unregister", json={"instance_id": "w-pool", "dp_rank": 0})
    assert r.status_code == 404
    r = await fx.client.post("/register", json=reg_body("w-pool"))
    assert r.status_code == 409


async def test_a_restored_instance_is_adopted_by_the_same_registration(fx: Fixture) -> None:
    restored = WorkerInfo(worker_id="sgl-a", url=NO_URL, model="tiny", namespace="tiny@0",
                          page_size=PS, kv_events_endpoint="tcp://127.0.0.1:31999",
                          kv_events_topic="")
    await fx.state.restore_workers([restored])  # a snapshot's worker: not in the API's table
    fx.store("sgl-a", TOKENS[:8])
    r = await fx.client.post("/register", json=reg_body())
    assert r.status_code == 200 and WorkerId("sgl-a") in fx.api.instances
    assert (await fx.query()).json()["default"]["sgl-a"]["longest_matched"] == 8  # kept


async def test_tenant_salt_and_lora_scope_the_keys(fx: Fixture, tmp_path: Any) -> None:
    adapter = str(tmp_path / "ad1")
    r = await fx.client.post("/register", json=reg_body(lora_paths={"ad1": adapter}))
    assert r.status_code == 200, r.text
    extra = lora_extra_key("ad1", adapter)
    fx.store("sgl-a", TOKENS[:16], cache_salt="tenant:acme")  # 4 salted pages
    fx.store("sgl-a", TOKENS[:8], extra_key=extra)  # 2 pages of the adapter
    fx.store("sgl-a", TOKENS[:4])  # 1 plain page

    async def longest(**kw: Any) -> int:
        r = await fx.query(**kw)
        assert r.status_code == 200, r.text
        return int(r.json()["default"]["sgl-a"]["longest_matched"])

    assert await longest(cache_salt="tenant:acme") == 16
    assert await longest(cache_salt="tenant:other") == 0  # negative control
    assert await longest() == 4
    assert await longest(cache_salt="") == 4  # an empty salt is no salt (SGLang's RadixKey)
    assert await longest(lora_name="ad1") == 8
    assert await longest(lora_id=extra) == 8  # their lora_id: SGLang's adapter id
    assert await longest(lora_name="ad1", cache_salt="tenant:acme") == 0
    assert await longest(lora_name="nope") == 0  # an adapter the instance cannot key
    # the subscriber re-keys the adapter's stores with the same key
    decoder = fx.state.subscriber._feeds[WorkerId("sgl-a")].decoder
    assert decoder._lora_extra_keys == {"ad1": extra}
    # tenant_id scopes the instances (registration), not the keys
    assert (await fx.query(tenant_id="acme")).json() == {"acme": {}}
    r = await fx.client.post("/register", json=reg_body("sgl-t", tenant_id="acme",
                                                        port=31200))
    assert r.status_code == 200
    assert list((await fx.query(tenant_id="acme")).json()["acme"]) == ["sgl-t"]
    assert "sgl-t" not in (await fx.query()).json()["default"]


@pytest.mark.parametrize("body, status, reason", [
    (b"{", 400, "invalid"),
    (b"[]", 400, "invalid"),
    (b"[" * 60_000, 400, "invalid"),
    (json.dumps({**reg_body(), "extra": 1}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "block_size": "4"}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "block_size": 0}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "block_size": 1 << 70}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "dp_rank": -1}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "dp_rank": 1 << 20}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "instance_id": "a/b"}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "instance_id": ""}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "instance_id": "x" * 300}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "tenant_id": "a\nb"}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "endpoint": "tcp://*:5557"}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "endpoint": "http://x:1"}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "endpoint": "tcp://h:0", "dp_rank": 1}).encode(), 400,
     "invalid"),
    (json.dumps({**reg_body(), "additionalsalt": "a/b"}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "url": "ftp://x"}).encode(), 400, "invalid"),
    (json.dumps({**reg_body(), "type": "Mooncake"}).encode(), 400, "unsupported"),
    (json.dumps({**reg_body(), "lora_name": "ad1"}).encode(), 400, "unknown_lora"),
    (b"x" * (ADMIN_BODY_MAX_BYTES + 1), 413, "too_large"),
])
async def test_bad_registrations_get_4xx(fx: Fixture, body: bytes, status: int,
                                         reason: str) -> None:
    r = await fx.client.post("/register", content=body)
    assert (r.status_code, r.json()["reason"]) == (status, reason), r.text
    assert fx.state.workers == {}


@pytest.mark.parametrize("change", [
    {"token_ids": [1, -1]}, {"token_ids": [1, 1 << 64]}, {"token_ids": [1.5]},
    {"token_ids": [True]}, {"token_ids": "abc"}, {"token_ids": None}, {"block_size": 0},
    {"block_size": 1 << 20}, {"block_size": 4.0}, {"model": 3}, {"cache_salt": "s" * 300},
    {"cache_salt": 5}, {"lora_name": "a", "lora_id": "0" * 32}, {"lora_id": "zz"},
    {"instance_id": "a\x00"}, {"unknown": 1}, {"cache_salt": "\ud800"},
])
async def test_bad_queries_get_400(fx: Fixture, change: dict[str, Any]) -> None:
    assert (await fx.client.post("/register", json=reg_body())).status_code == 200
    body = {"model": "tiny", "token_ids": TOKENS, "block_size": PS, **change}
    r = await fx.client.post("/query", content=json.dumps(body).encode())
    assert r.status_code == 400 and r.json()["reason"] == "invalid", r.text


async def test_oversized_query_and_wrong_method(fx: Fixture) -> None:
    r = await fx.client.post("/query", content=b"1", headers={"content-length": str(1 << 30)})
    assert r.status_code == 413
    r = await fx.client.post("/query", content=b'{"token_ids":' + b"[" * 2_000_000)
    assert r.status_code == 400  # nested deeper than the decoder takes
    r = await fx.client.get("/query")
    assert r.status_code == 405 and r.json()["reason"] == "method_not_allowed"
    r = await fx.client.post("/nope", json={})
    assert r.status_code == 404 and r.json()["reason"] == "not_found"


async def test_query_by_hash_is_refused_with_the_reason(fx: Fixture) -> None:
    r = await fx.client.post("/query_by_hash", json={"model": "tiny", "seq_hashes": [1, 2],
                                                     "block_size": PS})
    assert r.status_code == 501
    assert "XXH3" in r.json()["error"] and "/query" in r.json()["error"]


async def test_auth_token_and_loopback_rule() -> None:
    state = ServiceState(GlobalIndex(), heartbeat_timeout_s=3600)
    try:
        # no token: loopback peers only, and not through a proxy
        open_api = ConductorAPI(state)
        async with _client(open_api, peer="10.1.2.3") as remote:
            for path in ("/register", "/unregister", "/query", "/query_by_hash"):
                r = await remote.post(path, json={})
                assert r.status_code == 401 and r.json()["reason"] == "unauthenticated"
        async with _client(open_api, headers={"x-forwarded-for": "1.2.3.4"}) as proxied:
            assert (await proxied.post("/query", json={})).status_code == 401
        # a token: needed from everyone, loopback included
        api = ConductorAPI(state, admin_token=TOKEN)
        async with _client(api) as local:
            assert (await local.post("/register", json=reg_body())).status_code == 401
            r = await local.post("/register", json=reg_body(),
                                 headers={"authorization": "Bearer nope"})
            assert r.status_code == 401
        auth = {"authorization": f"Bearer {TOKEN}"}
        async with _client(api, peer="10.1.2.3", headers=auth) as remote:
            # from another host: an address only the worker's host reaches is refused
            # (interfaces.md, "Across hosts")
            r = await remote.post("/register", json=reg_body())
            assert r.status_code == 400 and "--radix-global-advertise-host" in r.json()["error"]
            r = await remote.post("/register", json=reg_body(
                endpoint="tcp://10.0.0.5:31000", url="http://10.0.0.5:30000"))
            assert r.status_code == 200, r.text
            assert (await remote.post("/query", json={
                "model": "tiny", "token_ids": TOKENS, "block_size": PS})).status_code == 200
    finally:
        await state.subscriber.close()


async def test_keepalive_keeps_registered_instances_until_unregistered(fx: Fixture) -> None:
    clock = [1000.0]
    fx.state.subscriber._clock = lambda: clock[0]
    fx.state.subscriber.timeout_s = 10.0
    assert (await fx.client.post("/register", json=reg_body())).status_code == 200
    clock[0] += 8
    fx.api.heartbeat_all()
    clock[0] += 8
    assert await fx.state.subscriber.check_timeouts() == []
    # forgotten by the service elsewhere (admin Deregister): the API's table follows
    await fx.state.deregister(WorkerId("sgl-a"))
    fx.api.heartbeat_all()
    assert fx.api.instances == {}


async def test_rank0_endpoint_layout() -> None:
    assert rank0_endpoint("tcp://h:5559", 2, "endpoint") == "tcp://h:5557"
    assert rank0_endpoint("ipc:///tmp/kv_dp3", 3, "endpoint") == "ipc:///tmp/kv"
    assert rank0_endpoint("inproc://x", 0, "endpoint") == "inproc://x"


async def test_served_over_http() -> None:
    state = ServiceState(GlobalIndex(), heartbeat_timeout_s=3600)
    try:
        async with conductor_api(state, "127.0.0.1", 0, admin_token=TOKEN) as server:
            assert server.port > 0
            auth = {"authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}",
                                         headers=auth) as c:
                r = await c.post("/register", json=reg_body(port=free_port()))
                assert r.status_code == 200, r.text
                r = await c.post("/query", json={"model": "tiny", "token_ids": TOKENS,
                                                 "block_size": PS})
                assert r.json()["default"]["sgl-a"]["longest_matched"] == 0
    finally:
        await state.subscriber.close()
