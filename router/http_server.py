"""The router's HTTP server: uvicorn (uvloop, httptools) with one socket write per answer.

uvicorn writes an answer's status line and headers as soon as the app sends
``http.response.start``, then the body in a second write: two syscalls and two wake-ups of the
client for every whole answer. :class:`CoalescingHttpToolsProtocol` hands uvicorn a transport
whose writes made in one event-loop step go out as one write at the end of that step (the
relay sends the head and the body of a whole answer in the same step). Streamed chunks still go
out as they come (each in its own step). Closing flushes first, so nothing is lost or reordered.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """Wraps a transport: ``write`` calls within one loop step become one ``write``."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # everything else is the real transport's
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a :class:`CoalescingTransport` (and without Nagle)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wrapped = CoalescingTransport(transport, asyncio.get_running_loop())
        super().connection_made(wrapped)  # type: ignore[arg-type]


def server_config(app: Any, host: str, port: int, log_level: str) -> Any:
    """The uvicorn configuration the router runs with."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          loop="uvloop", http=CoalescingHttpToolsProtocol, lifespan="on",
                          ws="none")
