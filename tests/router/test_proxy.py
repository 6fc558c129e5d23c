"""Proxy: failure classes against real sockets, disconnect watching, SSE helpers."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from http_peer import ServerThread, Upstream, free_port

from router.config import RouterConfig
from router.forward_relay import _last_event
from router.proxy import (
    ClientGone,
    Proxy,
    UpstreamUnavailable,
    forward_headers,
    response_headers,
    sse_error,
    until_disconnect,
)


def test_refused_connection_is_retryable_class():
    async def go() -> None:
        proxy = Proxy(RouterConfig(connect_timeout_s=1))
        try:
            with pytest.raises(UpstreamUnavailable):
                await proxy.post(f"http://127.0.0.1:{free_port()}/generate", b"{}", {})
            with pytest.raises(UpstreamUnavailable):
                await proxy.open_stream(f"http://127.0.0.1:{free_port()}/generate", b"{}", {})
        finally:
            await proxy.close()

    asyncio.run(go())


def test_stream_and_abort_against_peer():
    peer = Upstream()
    server = ServerThread(peer.app).start()

    async def go() -> None:
        proxy = Proxy(RouterConfig())
        try:
            body = json.dumps({"input_ids": [1], "stream": True}).encode()
            resp = await proxy.open_stream(f"{server.url}/generate", body,
                                           {"content-type": "application/json"})
            chunks = [c async for c in resp.aiter_raw()]
            await resp.aclose()
            assert b"[DONE]" in b"".join(chunks)
            await proxy.abort(server.url, "rid-1")
            await proxy.abort(f"http://127.0.0.1:{free_port()}", "rid-2")  # best effort
        finally:
            await proxy.close()

    try:
        asyncio.run(go())
    finally:
        server.stop()
    assert peer.aborted == ["rid-1"]


def test_until_disconnect():
    async def go() -> None:
        gone = asyncio.Event()

        async def receive() -> dict:
            await gone.wait()
            return {"type": "http.disconnect"}

        assert await until_disconnect(receive, asyncio.sleep(0, result=7)) == 7
        cancelled = asyncio.Event()

        async def slow() -> None:
            try:
                await asyncio.sleep(30)
            finally:
                cancelled.set()

        asyncio.get_running_loop().call_later(0.05, gone.set)
        with pytest.raises(ClientGone):
            await until_disconnect(receive, slow())
        assert cancelled.is_set()

    asyncio.run(go())


def test_headers_and_sse_helpers():
    fwd = forward_headers({"authorization": "Bearer k", "host": "x", "content-length": "3"})
    assert fwd == {"authorization": "Bearer k", "content-type": "application/json"}
    kept = response_headers(httpx.Headers({"content-type": "text/event-stream",
                                           "content-length": "9", "server": "uvicorn"}))
    assert kept == {"content-type": "text/event-stream"}
    err = sse_error("boom").decode()
    assert json.loads(err.split("\n\n")[0][5:])["error"]["message"] == "boom"
    assert err.endswith("data: [DONE]\n\n")
    tail = b'data: {"a": 1}\n\ndata: {"usage": {"prompt_tokens": 3}}\n\ndata: [DONE]\n\n'
    assert _last_event(tail) == {"usage": {"prompt_tokens": 3}}
    assert _last_event(b"garbage") is None
