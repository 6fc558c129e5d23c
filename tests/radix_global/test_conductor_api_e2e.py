"""End to end: one real SGLang CPU worker publishing KV events, registered through Mooncake's
Conductor ``POST /register`` with a client written from Mooncake's API documentation
(``docs/source/api-reference/http/conductor-indexer.md``), in front of the real index service
(gRPC ``IndexServer``).

After a prompt, ``/query``'s longest match for it equals the gRPC ``Match`` of our page keys and
the tokens the engine reports cached when the prompt is sent again; a tenant's salted prompt
matches under its salt only (another salt, and no salt, get nothing).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import RunningServer, sglang_server

from radix_global.client import AsyncIndexClient
from radix_global.conductor_api import serve_conductor_api
from radix_global.keys import page_keys
from radix_global.service import IndexServer, ServiceConfig
from radix_global.types import Namespace, WorkerId
from sglang_patch.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.asyncio, pytest.mark.timeout(900)]
PAGE = 16
INSTANCE = "sgl-conductor-0"
TOKEN = "e2e-token"


class MooncakeIndexerClient:
    """What a gateway written against Mooncake's Conductor indexer API sends (their field
    names and shapes: /register, /unregister, /query)."""

    def __init__(self, base_url: str, token: str | None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30)

    async def register(self, endpoint: str, replay_endpoint: str, instance_id: str,
                       model: str, block_size: int, dp_rank: int = 0) -> dict[str, Any]:
        r = await self._http.post("/register", json={
            "endpoint": endpoint, "replay_endpoint": replay_endpoint, "type": "SGLang",
            "modelname": model, "lora_name": "", "tenant_id": "default",
            "instance_id": instance_id, "block_size": block_size, "dp_rank": dp_rank,
            "additionalsalt": ""})
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def unregister(self, instance_id: str, model: str, block_size: int) -> dict[str, Any]:
        r = await self._http.post("/unregister", json={
            "type": "SGLang", "modelname": model, "lora_name": "", "tenant_id": "default",
            "instance_id": instance_id, "block_size": block_size, "dp_rank": 0})
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def query(self, model: str, token_ids: list[int], block_size: int,
                    cache_salt: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "lora_name": "", "token_ids": token_ids,
                                "tenant_id": "default", "block_size": block_size}
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        r = await self._http.post("/query", json=body)
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def close(self) -> None:
        await self._http.aclose()


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path) -> Iterator[tuple[RunningServer, str, str]]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    events = {"publisher": "zmq", "bind": True, "endpoint": endpoint,
              "replay_endpoint": replay, "topic": "kv-events"}
    args = ["--served-model-name", "tiny", "--page-size", str(PAGE), "--max-total-tokens",
            "32768", "--enable-cache-report", "--kv-events-config", json.dumps(events)]
    with sglang_server(tiny_model_dir, args) as server:
        yield server, endpoint, replay


async def _generate(c: httpx.AsyncClient, tokens: list[int], **extra: Any) -> int:
    """Send ``tokens`` to the engine; the tokens it reports cached."""
    r = await c.post("/generate", json={
        "input_ids": tokens, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        **extra})
    assert r.status_code == 200, r.text
    return int(r.json()["meta_info"]["cached_tokens"])


async def _longest(client: MooncakeIndexerClient, tokens: list[int],
                   cache_salt: str | None = None) -> int:
    hits = (await client.query("tiny", tokens, PAGE, cache_salt))["default"]
    return int(hits[INSTANCE]["longest_matched"])


async def _until_longest(client: MooncakeIndexerClient, tokens: list[int], want: int,
                         cache_salt: str | None = None, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while (got := await _longest(client, tokens, cache_salt)) != want:
        assert time.monotonic() < end, f"longest_matched {got}, want {want}"
        await asyncio.sleep(0.2)


async def test_conductor_api_answers_like_our_match_and_the_engine(worker: Any) -> None:
    server, endpoint, replay = worker
    index = await IndexServer(ServiceConfig(port=0, admin_token=TOKEN)).start()
    conductor = await serve_conductor_api(index.state, "127.0.0.1", 0, TOKEN)
    mooncake = MooncakeIndexerClient(f"http://127.0.0.1:{conductor.port}", TOKEN)
    grpc_client = AsyncIndexClient(f"127.0.0.1:{index.port}", admin_token=TOKEN)
    engine = httpx.AsyncClient(base_url=server.url, timeout=300)
    try:
        reply = await mooncake.register(endpoint, replay, INSTANCE, "tiny", PAGE)
        assert reply["status"] == "registered successfully" and reply["subscribed"] is True
        ns = Namespace(reply["namespace"])

        prompt = [10 + (i * 37) % 8000 for i in range(PAGE * 5 + 5)]  # 5 full pages + 5
        assert await _longest(mooncake, prompt) == 0
        assert await _generate(engine, prompt) == 0
        await _until_longest(mooncake, prompt, PAGE * 5)
        answer = (await mooncake.query("tiny", prompt, PAGE))["default"][INSTANCE]
        m = await grpc_client.match(ns, page_keys(prompt, PAGE))
        held = m.matched[(WorkerId(INSTANCE), 0)]
        assert answer == {"longest_matched": held.pool * PAGE, "GPU": held.gpu * PAGE,
                          "CPU": held.host * PAGE, "DISK": held.pool * PAGE,
                          "DP": {"0": held.pool * PAGE}}
        cached = await _generate(engine, prompt)  # the repeat: what the engine reuses
        assert cached == answer["longest_matched"] == PAGE * 5
        # negative control: another tenant's salt keys other pages
        assert await _longest(mooncake, prompt, "tenant:other") == 0

        # a tenant's salted prompt: found under its salt only
        salted = [20 + (i * 53) % 8000 for i in range(PAGE * 3 + 2)]
        assert await _generate(engine, salted, cache_salt="tenant:acme") == 0
        await _until_longest(mooncake, salted, PAGE * 3, cache_salt="tenant:acme")
        m = await grpc_client.match(ns, page_keys(salted, PAGE, cache_salt="tenant:acme"))
        assert m.matched[(WorkerId(INSTANCE), 0)].pool * PAGE == PAGE * 3
        assert await _longest(mooncake, salted, "tenant:other") == 0
        assert await _longest(mooncake, salted) == 0
        assert await _generate(engine, salted, cache_salt="tenant:acme") == PAGE * 3
        assert await _generate(engine, salted, cache_salt="tenant:other") == 0

        out = await mooncake.unregister(INSTANCE, "tiny", PAGE)
        assert out["removed_instances"] == [f"{INSTANCE}|default|0"]
        assert (await mooncake.query("tiny", prompt, PAGE)) == {"default": {}}
        assert INSTANCE not in index.state.workers
    finally:
        await engine.aclose()
        await mooncake.close()
        await grpc_client.close()
        await conductor.stop()
        await index.stop()
