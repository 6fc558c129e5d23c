"""A tiny real HTTP peer speaking SGLang's streamed ``/generate`` protocol, for replay tests.

It answers on loopback under uvicorn (a thread), so the replay client's real HTTP/SSE stack runs.
Behaviour per request is steered by attributes: ``ttft_s`` (delay before the first chunk),
``tbt_s`` (delay between chunks), ``tokens_per_chunk``, ``cached_tokens``/``storage_tokens``
(reported in ``meta_info``), ``reject_every`` (every n-th request answers 429), ``die_after``
(stream ends early after that many chunks). Arrival times are recorded in ``arrivals``.
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


class SsePeer:
    def __init__(self) -> None:
        self.ttft_s = 0.05
        self.tbt_s = 0.01
        self.tokens_per_chunk = 1
        self.cached_tokens = 0
        self.storage_tokens: int | None = None
        self.reject_every = 0
        self.die_after: int | None = None
        self.arrivals: list[float] = []
        self.bodies: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/generate", self._generate, methods=["POST"]),
                                     Route("/health", self._health)])
        self.port = free_port()  # below the ephemeral range: bound later, by uvicorn
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                     log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> SsePeer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("peer did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _generate(self, request: Request) -> Response:
        self.arrivals.append(time.perf_counter())
        body = await request.json()
        self.bodies.append(body)
        if self.reject_every and len(self.bodies) % self.reject_every == 0:
            return JSONResponse({"error": {"message": "ttft_slo"}}, status_code=429)
        want = int(body["sampling_params"]["max_new_tokens"])
        prompt_tokens = len(body["input_ids"]) if "input_ids" in body else len(body["text"].split())
        return StreamingResponse(self._stream(want, prompt_tokens),
                                 media_type="text/event-stream",
                                 headers={"x-radix-worker": "w7", "x-radix-prefix-tokens": "16",
                                          "x-radix-hold-ms": "250"})

    async def _stream(self, want: int, prompt_tokens: int) -> AsyncIterator[bytes]:
        await asyncio.sleep(self.ttft_s)
        done, chunks = 0, 0
        while done < want:
            if chunks:
                await asyncio.sleep(self.tbt_s)
            done = min(want, done + (1 if chunks == 0 else self.tokens_per_chunk))
            chunks += 1
            details: dict[str, Any] = {"device": self.cached_tokens, "host": 0}
            if self.storage_tokens is not None:
                details["storage"] = self.storage_tokens
            meta = {"prompt_tokens": prompt_tokens, "completion_tokens": done,
                    "cached_tokens": self.cached_tokens + (self.storage_tokens or 0),
                    "cached_tokens_details": details}
            yield f"data: {json.dumps({'text': 'x' * done, 'meta_info': meta})}\n\n".encode()
            if self.die_after is not None and chunks >= self.die_after:
                return
        yield b"data: [DONE]\n\n"
