"""Forwarding to a worker: one pooled ``httpx.AsyncClient``, plain and streamed pass-through.

Failure classes matter to the caller: :class:`UpstreamUnavailable` means the worker never saw the
request (connection refused / connect timeout), so it is safe to retry on another worker;
:class:`UpstreamFailed` means it may have started. A stream that breaks after bytes were relayed
cannot be retried: the relay ends it with an error event instead (:func:`sse_error`).
Client disconnects are watched by :func:`until_disconnect`, which cancels the upstream work and lets
the caller abort the engine request (SGLang ``POST /abort_request {"rid": ...}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

import httpx

from router.config import RouterConfig

log = logging.getLogger("radix_global.router.proxy")
T = TypeVar("T")

# Request headers worth passing on; hop-by-hop and length headers are recomputed by httpx.
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


def response_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}


def sse_error(message: str, code: int = 502) -> bytes:
    """An OpenAI-style error event, then ``[DONE]``, so clients end the stream cleanly."""
    body = json.dumps({"error": {"message": message, "type": "upstream_error", "code": code}})
    return f"data: {body}\n\ndata: [DONE]\n\n".encode()


class Proxy:
    """Owns the connection pool to all workers."""

    def __init__(self, config: RouterConfig, transport: httpx.AsyncBaseTransport | None = None):
        limits = httpx.Limits(max_connections=config.max_connections,
                              max_keepalive_connections=config.max_connections)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s),
            limits=limits, transport=transport)

    async def close(self) -> None:
        await self.client.aclose()

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        """POST and read the whole answer."""
        try:
            resp = await self.client.post(url, content=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise UpstreamUnavailable(f"{url}: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise UpstreamFailed(f"{url}: {exc!r}") from exc
        return resp

    async def open_stream(self, url: str, body: bytes, headers: dict[str, str]
                          ) -> httpx.Response:
        """POST and return once the status line and headers arrived; the caller reads the body
        with ``aiter_raw()`` and must ``aclose()`` the response."""
        request = self.client.build_request("POST", url, content=body, headers=headers)
        try:
            return await self.client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise UpstreamUnavailable(f"{url}: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise UpstreamFailed(f"{url}: {exc!r}") from exc

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
    """
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    # the cancellation (or whatever the work ended with) is expected here
    with contextlib.suppress(BaseException):
        await task
    raise ClientGone()
