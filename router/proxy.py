"""Forwarding to a worker: pooled keep-alive connections, plain and streamed pass-through.

The data plane uses ``aiohttp``'s client: on the router-overhead benchmark it costs a fraction of
``httpx.AsyncClient``'s per-request time (``docs/benchmarks.md``); the control plane (health
checks, ``/server_info``, aborts) uses ``httpx`` (:attr:`Proxy.client`).

Failure classes matter to the caller: :class:`UpstreamUnavailable` means the worker never saw the
request (connection refused / connect timeout), so it is safe to retry on another worker;
:class:`UpstreamFailed` means it may have started. A stream that breaks after bytes were relayed
cannot be retried: the relay ends it with an error event instead (:func:`sse_error`).
Client disconnects are watched by :func:`until_disconnect`, which cancels the upstream work and lets
the caller abort the engine request (SGLang ``POST /abort_request {"rid": ...}``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from typing import Any, TypeVar

import aiohttp
import httpx

from router.config import RouterConfig

log = logging.getLogger("radix_global.router.proxy")
T = TypeVar("T")

# Request headers worth passing on; hop-by-hop and length headers are recomputed.
_FORWARD_HEADERS = ("authorization", "accept", "user-agent", "x-request-id")
_DROP_RESPONSE_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive",
                          "content-encoding", "date", "server"}


class UpstreamUnavailable(Exception):
    """The worker did not take the request (connect error): retry elsewhere is safe."""


class UpstreamFailed(Exception):
    """The worker failed after the request may have reached it."""


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


def forward_headers(headers: Any) -> dict[str, str]:
    out = {k: headers[k] for k in _FORWARD_HEADERS if k in headers}
    out["content-type"] = "application/json"
    return out


def response_headers(headers: Any) -> dict[str, str]:
    items: Iterable[tuple[str, str]] = headers.items()
    return {k: v for k, v in items if k.lower() not in _DROP_RESPONSE_HEADERS}


def sse_error(message: str, code: int = 502) -> bytes:
    """An OpenAI-style error event, then ``[DONE]``, so clients end the stream cleanly."""
    body = json.dumps({"error": {"message": message, "type": "upstream_error", "code": code}})
    return f"data: {body}\n\ndata: [DONE]\n\n".encode()


class UpstreamResponse:
    """A worker's answer: status and headers at once, the body whole or as chunks."""

    def __init__(self, resp: aiohttp.ClientResponse, content: bytes | None = None) -> None:
        self._resp = resp
        self.status_code = resp.status
        self.headers = resp.headers
        self.content = content if content is not None else b""

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive; a broken connection raises :class:`UpstreamFailed`."""
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamFailed(repr(exc)) from exc

    async def aclose(self) -> None:
        self._resp.close()


class Proxy:
    """Owns the connection pools to all workers."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s))
        self._session: aiohttp.ClientSession | None = None

    def _data(self) -> aiohttp.ClientSession:
        # Created lazily: an aiohttp session belongs to the running event loop.
        if self._session is None:
            cfg = self.config
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=cfg.max_connections, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s,
                                              sock_read=cfg.request_timeout_s),
                auto_decompress=False, skip_auto_headers=("User-Agent",))
        return self._session

    async def close(self) -> None:
        await self.client.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(self, url: str, body: bytes, headers: dict[str, str]
                    ) -> aiohttp.ClientResponse:
        try:
            return await self._data().post(url, data=body, headers=headers)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise UpstreamUnavailable(f"{url}: {exc!r}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamFailed(f"{url}: {exc!r}") from exc

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """POST and read the whole answer."""
        resp = await self._send(url, body, headers)
        try:
            content = await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamFailed(f"{url}: {exc!r}") from exc
        finally:
            resp.release()
        return UpstreamResponse(resp, content)

    async def open_stream(self, url: str, body: bytes, headers: dict[str, str]
                          ) -> UpstreamResponse:
        """POST and return once the status line and headers arrived; the caller reads the body
        with ``aiter_raw()`` and must ``aclose()`` the response."""
        return UpstreamResponse(await self._send(url, body, headers))

    async def abort(self, base_url: str, rid: str) -> None:
        """Ask an SGLang worker to abort ``rid``; best effort (the worker may be gone)."""
        try:
            await self.client.post(f"{base_url}/abort_request", json={"rid": rid}, timeout=2.0)
        except httpx.HTTPError as exc:
            log.info("abort of %s on %s failed: %r", rid, base_url, exc)


async def until_disconnect(receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
                           work: Awaitable[T]) -> T:
    """Run ``work``; if the ASGI client disconnects first, cancel it and raise :class:`ClientGone`.

    ``receive`` must be the raw ASGI receive whose request body was already consumed, so the
    next message it yields is ``http.disconnect``.

    ``work`` runs in the calling task (no second task, no ``asyncio.wait``: both were a visible
    share of a request's router time); a watcher task cancels the caller on disconnect.
    """
    caller = asyncio.current_task()
    if caller is None:
        raise RuntimeError("until_disconnect must run inside a task")
    state = {"done": False, "gone": False}

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not state["done"]:
                    state["gone"] = True
                    caller.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
    except asyncio.CancelledError:
        if not state["gone"]:
            raise
        caller.uncancel()
        raise ClientGone() from None
    finally:
        state["done"] = True
        watcher.cancel()
    return result
