"""Forwarding to a worker: pooled keep-alive connections, plain and streamed pass-through.

The data plane uses the lean client of ``router/transport/http_client.py`` (asyncio protocol +
httptools, one write per request): on the router-overhead benchmark aiohttp's request machinery
was the largest Python cost of a forwarded request (``docs/benchmarks.md``). The control plane
(health checks, ``/server_info``, aborts) uses ``httpx`` (:attr:`Proxy.client`).

Failure classes matter to the caller: :class:`UpstreamUnavailable` means the worker never saw the
request (connection refused / connect timeout), so it is safe to retry on another worker;
:class:`UpstreamFailed` means it may have started. A stream that breaks after bytes were relayed
cannot be retried: the relay ends it with an error event instead
(``router.transport.errors.sse_error``).
Client disconnects are watched by :func:`until_disconnect`, which cancels the upstream work and lets
the caller abort the engine request (SGLang ``POST /abort_request {"rid": ...}``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass
from typing import Annotated, TypeVar

import httpx
from starlette.types import Receive, Scope

from radix_global.options import opt
from router.transport.http_client import (
    ConnectFailed,
    HttpAnswer,
    HttpPool,
    RequestFailed,
    WorkerGone,
)
from router.transport.http_server import DISCONNECT_HOOK

log = logging.getLogger("radix_global.router.transport.proxy")
T = TypeVar("T")

# Request headers worth passing on; hop-by-hop and length headers are recomputed. Not the
# client's x-request-id: engines may key requests by it (vLLM), so the relay sends the router's.
_FORWARD_HEADERS = frozenset({b"authorization", b"accept", b"user-agent"})


@dataclass(frozen=True)
class ProxyConfig:
    """Proxy: timeouts, pool size and retries towards the workers.

    ``RouterConfig.proxy``; options of the same names."""

    connect_timeout_s: Annotated[float, opt("connect timeout to a worker", gt=0)] = 5.0
    request_timeout_s: Annotated[float, opt("timeout of a forwarded request", gt=0)] = 600.0
    max_connections: Annotated[int, opt(
        "connection pool size to the workers (pooled keep-alive connections)", ge=1)] = 1024
    max_retries: Annotated[int, opt(
        "other workers tried when one refuses the connection", ge=0)] = 2


class UpstreamUnavailable(Exception):
    """The worker did not take the request (connect error): retry elsewhere is safe."""


class UpstreamGone(UpstreamUnavailable):
    """The worker left the cluster before it answered (:meth:`Proxy.break_worker`): retry
    elsewhere, and do not count it as a refused connect (it is not the worker's new fault)."""


class UpstreamFailed(Exception):
    """The worker failed after the request may have reached it."""


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


def forward_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The client's headers passed on to a worker, from the ASGI scope's ``headers`` (names in
    lower case; a repeated header's first value): one pass, no per-name search of the list."""
    out: dict[str, str] = {}
    for name, value in raw:
        if name in _FORWARD_HEADERS:
            out.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    out["content-type"] = "application/json"
    return out


class UpstreamResponse:
    """A worker's answer: status and headers at once (``headers``: raw pairs without hop-by-hop
    and framing headers), the body whole (``content``) or as chunks (:meth:`aiter_raw`)."""

    def __init__(self, answer: HttpAnswer, content: bytes | None = None) -> None:
        self._answer = answer
        self.status_code = answer.status_code
        self.headers = answer.headers
        self.content = content if content is not None else b""

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive; a broken connection raises :class:`UpstreamFailed`."""
        try:
            async for chunk in self._answer.chunks():
                yield chunk
        except RequestFailed as exc:
            raise UpstreamFailed(str(exc)) from exc

    async def aclose(self) -> None:
        self._answer.close()


class Proxy:
    """Owns the connection pools to all workers."""

    def __init__(self, config: ProxyConfig = ProxyConfig()) -> None:
        self.config = config
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s))
        self._pool = HttpPool(connect_timeout_s=config.connect_timeout_s,
                              read_timeout_s=config.request_timeout_s,
                              max_connections=config.max_connections)

    async def close(self) -> None:
        await self.client.aclose()
        self._pool.close()

    async def _send(self, url: str, body: bytes, headers: dict[str, str]) -> HttpAnswer:
        try:
            return await self._pool.post(url, body, headers.items())
        except WorkerGone as exc:
            raise UpstreamGone(f"{url}: {exc}") from exc
        except ConnectFailed as exc:
            raise UpstreamUnavailable(f"{url}: {exc}") from exc
        except RequestFailed as exc:
            raise UpstreamFailed(f"{url}: {exc}") from exc

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """POST and read the whole answer."""
        answer = await self._send(url, body, headers)
        try:
            content = await answer.read()
        except RequestFailed as exc:
            raise UpstreamFailed(f"{url}: {exc}") from exc
        finally:
            answer.close()
        return UpstreamResponse(answer, content)

    async def open_stream(self, url: str, body: bytes, headers: dict[str, str]
                          ) -> UpstreamResponse:
        """POST and return once the status line and headers arrived; the caller reads the body
        with ``aiter_raw()`` and must ``aclose()`` the response."""
        return UpstreamResponse(await self._send(url, body, headers))

    def break_worker(self, base_url: str, reason: str) -> int:
        """End every exchange in flight to the worker at ``base_url`` with ``reason`` (it left
        the cluster). One whose answer had not begun is :class:`UpstreamUnavailable` (the relay
        retries it elsewhere: no byte of it reached the client, and its worker is gone); one
        that was streaming is :class:`UpstreamFailed` (the relay ends it with an error event).
        Returns how many."""
        try:
            return self._pool.break_connections(base_url, reason)
        except ConnectFailed:  # not an http:// URL: the pool never connected to it
            return 0

    async def abort(self, base_url: str, rid: str) -> None:
        """Ask an SGLang worker to abort ``rid``; best effort (the worker may be gone)."""
        try:
            await self.client.post(f"{base_url}/abort_request", json={"rid": rid}, timeout=2.0)
        except httpx.HTTPError as exc:
            log.info("abort of %s on %s failed: %r", rid, base_url, exc)


async def until_disconnect(scope: Scope, receive: Receive, work: Awaitable[T]) -> T:
    """Run ``work``; if the ASGI client disconnects first, cancel it and raise :class:`ClientGone`.

    ``work`` runs in the calling task. Under the router's own server the connection's
    :class:`~router.transport.http_server.DisconnectHook` (in ``scope["extensions"]``) cancels the
    caller when the connection is lost: no second task. Under any other ASGI server a watcher task
    waits on ``receive``, which must be the raw ASGI receive whose request body was already
    consumed, so that the next message it yields is ``http.disconnect``.
    """
    caller = asyncio.current_task()
    if caller is None:
        raise RuntimeError("until_disconnect must run inside a task")
    state = {"done": False, "gone": False}

    def lost() -> None:
        if not state["done"] and not state["gone"]:
            state["gone"] = True
            caller.cancel()

    hook = scope.get("extensions", {}).get(DISCONNECT_HOOK)
    watcher: asyncio.Future[None] | None = None
    if hook is not None:
        if hook.lost:  # gone before the work began
            if asyncio.iscoroutine(work):
                work.close()
            raise ClientGone()
        hook.add(lost)
    else:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            lost()

        watcher = asyncio.ensure_future(watch())
    try:
        result = await work
        if state["gone"]:  # the work ended as the client left, and swallowed the cancel
            raise asyncio.CancelledError
    except asyncio.CancelledError:
        if not state["gone"]:
            raise
        caller.uncancel()
        raise ClientGone() from None
    finally:
        state["done"] = True
        if hook is not None:
            hook.discard(lost)
        if watcher is not None:
            watcher.cancel()
    return result
