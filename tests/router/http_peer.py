"""A minimal real HTTP peer speaking the SGLang worker protocol, on loopback, for router tests.

Not a fake of our code: it answers the engine's wire protocol (``/health``, ``/server_info``,
``/generate``, OpenAI endpoints with SSE, ``/abort_request``) so the router's real HTTP stack is
exercised. Behaviour is steered per test through attributes (``mode``, ``cached_tokens``...).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sglang_patch.ports import free_port


class ServerThread:
    """Run an ASGI app under uvicorn in a thread, on a free loopback port (``router=True``: with
    the router's own server configuration, ``router.transport.http_server``)."""

    def __init__(self, app: Any, port: int | None = None, *, router: bool = False) -> None:
        from router.transport.http_server import server_config

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = (server_config(app, "127.0.0.1", self.port, "warning") if router else
                  uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                 lifespan="on"))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class Upstream:
    """State and app of one peer worker."""

    def __init__(self, model: str = "tiny", model_path: str | None = None, page_size: int = 4,
                 context_length: int = 512, role: str = "null") -> None:
        self.model, self.model_path, self.role = model, model_path, role
        self.page_size, self.context_length = page_size, context_length
        self.healthy = True
        self.mode = "ok"  # ok | die_mid_stream | slow | linger
        self.headers: list[dict[str, str]] = []  # request headers, as self.requests
        self.cached_tokens = 0
        self.report: dict[str, Any] = {}  # fields of /server_info reported over the sane ones
        self.chunks = 3
        # Set: a stream sends its first chunk only once this is set (an engine busy prefilling).
        self.first_chunk: threading.Event | None = None
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.raw_requests: list[bytes] = []  # the bodies as they arrived, as self.requests
        self.aborted: list[str] = []
        self.app = Starlette(routes=[
            Route("/health", self._health), Route("/server_info", self._info),
            Route("/generate", self._generate, methods=["POST"]),
            Route("/v1/completions", self._openai, methods=["POST"]),
            Route("/v1/chat/completions", self._openai, methods=["POST"]),
            Route("/abort_request", self._abort, methods=["POST"]),
        ])

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200 if self.healthy else 503)

    async def _info(self, request: Request) -> Response:
        return JSONResponse({"served_model_name": self.model, "model_path": self.model_path,
                             "tokenizer_path": self.model_path, "page_size": self.page_size,
                             "context_length": self.context_length, "dp_size": 1,
                             "kv_events_config": None, "disaggregation_mode": self.role,
                             "disaggregation_bootstrap_port": 8998, **self.report})

    async def _abort(self, request: Request) -> Response:
        self.aborted.append((await request.json())["rid"])
        return Response(status_code=200)

    def _meta(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"cached_tokens": self.cached_tokens, "prompt_tokens": 10, "id": body.get("rid")}

    async def _stream(self, make: Any) -> AsyncIterator[bytes]:
        if self.first_chunk is not None:
            await asyncio.to_thread(self.first_chunk.wait, 30)
        for i in range(self.chunks):
            if self.mode == "slow":
                await asyncio.sleep(0.2)
            yield f"data: {json.dumps(make(i))}\n\n".encode()
            if self.mode == "die_mid_stream":
                raise RuntimeError("worker died mid-stream")
        yield b"data: [DONE]\n\n"
        if self.mode == "linger":  # an engine slow to close its side after the answer
            await asyncio.sleep(2)

    async def _generate(self, request: Request) -> Response:
        self.raw_requests.append(await request.body())
        body = await request.json()
        self.requests.append(("/generate", body))
        self.headers.append(dict(request.headers))
        if body.get("stream"):
            return StreamingResponse(self._stream(
                lambda i: {"text": "x" * (i + 1), "meta_info": self._meta(body)}),
                media_type="text/event-stream")
        if self.mode == "slow":
            await asyncio.sleep(5)
        text = "hello" if self.role == "null" else f"hello from {self.role}"
        return JSONResponse({"text": text, "meta_info": self._meta(body)})

    async def _openai(self, request: Request) -> Response:
        self.raw_requests.append(await request.body())
        body = await request.json()
        self.requests.append((request.url.path, body))
        self.headers.append(dict(request.headers))
        usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                 "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
        if body.get("stream"):
            return StreamingResponse(self._stream(
                lambda i: {"id": "c", "object": "chat.completion.chunk",
                           "choices": [{"index": 0, "delta": {"content": "x"}}],
                           "usage": usage if i == self.chunks - 1 else None}),
                media_type="text/event-stream")
        return JSONResponse({"id": "c", "object": "chat.completion", "model": self.model,
                             "choices": [{"index": 0, "message": {"role": "assistant",
                                                                  "content": "hi"}}],
                             "usage": usage})


def registered_workers(client: Any, n: int, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """The router's ``/admin/workers`` once ``n`` workers have registered (``client``: an
    ``httpx.Client`` on the router), bounded by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    workers: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        workers = client.get("/admin/workers").json()["workers"]
        if len(workers) >= n:
            return workers
        time.sleep(0.5)
    raise AssertionError(f"{len(workers)} of {n} workers registered: {workers}")
