"""The router's HTTP server: uvicorn (uvloop, httptools) with one socket write per answer.

uvicorn writes an answer's status line and headers as soon as the app sends
``http.response.start``, then the body in a second write: two syscalls and two wake-ups of the
client for every whole answer. :class:`CoalescingHttpToolsProtocol` hands uvicorn a transport
that holds a write back until the next write of the same event-loop step (then both go out
together, at once) or the end of that step (then it goes out alone). The relay sends the head and
the body of a whole answer in one step, so they leave in one write, before the relay's
bookkeeping that follows in that step. Closing flushes first: nothing is lost or reordered.

The protocol also tells the app when the client's connection is lost, through a
:class:`DisconnectHook` in the request's ASGI scope (``scope["extensions"]``, key
:data:`DISCONNECT_HOOK`): a callback, where the portable ASGI way (a task per request waiting on
``receive()`` for ``http.disconnect``) cost a task creation and two task steps per forwarded
request. ``router.transport.proxy.until_disconnect`` uses the hook when the server offers it and
falls back to the portable way under any other server.

It also bounds what a client may hold (:class:`ServerLimits`): a request's head must arrive
within ``header_timeout_s`` of the connection (or of the previous answer's end) and its body
within ``body_timeout_s`` of the head, or the connection is closed; an idle keep-alive
connection is closed after ``keep_alive_s`` (uvicorn's own timer); beyond ``max_connections``
new requests get 503 (uvicorn's ``limit_concurrency``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from radix_global.options import opt


class CoalescingTransport:
    """Wraps a transport: a write waits for the next one of the same loop step, at most until the
    step ends."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: bytes | None = None

    def write(self, data: bytes) -> None:
        pending = self._pending
        if pending is None:
            self._pending = data
            self._loop.call_soon(self.flush)
        else:
            self._pending = None  # the scheduled flush finds nothing
            self._transport.write(pending + data)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # everything else is the real transport's
        return getattr(self._transport, name)


DISCONNECT_HOOK = "radix_global.disconnect"


class DisconnectHook:
    """One connection's loss, as callbacks: :meth:`add` one while a request's answer is being
    made, :meth:`discard` it when done. Callbacks run from the event loop (the protocol's
    ``connection_lost``); check :attr:`lost` before adding one."""

    __slots__ = ("_callbacks", "lost")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []
        self.lost = False

    def add(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def fire(self) -> None:
        self.lost = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


@dataclass(frozen=True)
class ServerLimits:
    """Client connections: what one client may hold of the router.

    See the module docstring; ``RouterConfig.client``, options ``client_*`` and
    ``max_body_bytes``."""

    header_timeout_s: Annotated[float, opt(
        "a client's request head must arrive within this", gt=0)] = 10.0
    body_timeout_s: Annotated[float, opt("... and its body within this of the head", gt=0)] = 60.0
    keep_alive_s: Annotated[int, opt(
        "idle keep-alive client connections are closed after this", ge=0)] = 5
    max_connections: Annotated[int, opt(
        "concurrent client connections; beyond: 503", ge=1)] = 4096
    max_body_bytes: Annotated[int, opt(
        "largest request body accepted", ge=1, name="max_body_bytes")] = 16 * 1024 * 1024


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a :class:`CoalescingTransport` (and without Nagle), with a
    :class:`DisconnectHook` in every request's scope and read deadlines (:class:`ServerLimits`,
    ``limits`` set by :func:`server_config`)."""

    limits = ServerLimits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wrapped = CoalescingTransport(transport, asyncio.get_running_loop())
        self._disconnect = DisconnectHook()
        # The read deadline is a number, checked by one watchdog timer per connection that
        # re-arms itself at the current deadline: no timer created or cancelled per request.
        self._deadline: float | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        super().connection_made(wrapped)  # type: ignore[arg-type]
        self._expect(self.limits.header_timeout_s)  # a connection that never sends a request

    def _expect(self, seconds: float) -> None:
        """What is being read must be complete within ``seconds`` from now."""
        self._deadline = self.loop.time() + seconds
        if self._watchdog is not None and self._watchdog.when() > self._deadline:
            self._watchdog.cancel()  # armed for a later deadline (a slow body before)
            self._watchdog = None
        if self._watchdog is None:
            self._watchdog = self.loop.call_at(self._deadline, self._watch)

    def _watch(self) -> None:
        deadline, self._watchdog = self._deadline, None
        if deadline is None:  # nothing being read: the next request arms it again
            return
        if self.loop.time() < deadline:
            self._watchdog = self.loop.call_at(deadline, self._watch)
        elif not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a keep-alive connection's next request
            self._expect(self.limits.header_timeout_s)
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
        extensions[DISCONNECT_HOOK] = self._disconnect

    def on_headers_complete(self) -> None:
        self._expect(self.limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._deadline = None
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        super().connection_lost(exc)
        self._disconnect.fire()


def server_config(app: Any, host: str, port: int, log_level: str,
                  limits: ServerLimits = ServerLimits()) -> Any:
    """The uvicorn configuration the router runs with."""
    import uvicorn

    protocol = type("LimitedHttpToolsProtocol", (CoalescingHttpToolsProtocol,),
                    {"limits": limits})
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          loop="uvloop", http=protocol, lifespan="on", ws="none",
                          proxy_headers=False, timeout_keep_alive=limits.keep_alive_s,
                          limit_concurrency=limits.max_connections)
