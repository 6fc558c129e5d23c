"""A lean HTTP/1.1 client for the data plane: keep-alive pools on asyncio protocols + httptools.

Why not aiohttp: on the router-overhead benchmark its request building and response machinery
were the largest Python cost of a forwarded request (``docs/benchmarks.md``). This client does
only what the router's upstream leg needs: ``POST`` a body already encoded, one write per request
(head and body together), the answer parsed by httptools (C), delivered whole or as chunks.

Contract:
- :meth:`HttpPool.post` returns once the status line and headers arrived: an
  :class:`HttpAnswer` whose body is read with :meth:`HttpAnswer.read` or
  :meth:`HttpAnswer.chunks`, and which must be :meth:`HttpAnswer.close`\\ d (idempotent; a
  completely read keep-alive answer returns its connection to the pool).
- :class:`ConnectFailed`: no connection was made (refused, unreachable, connect timeout), so
  the server never saw the request. :class:`RequestFailed`: anything after (the server may have
  started the work): reset, malformed answer, no bytes for ``read_timeout_s``.
- A pooled connection the server closed while idle is retried once on a fresh connection when it
  ends before any answer byte (the server cannot have processed a request it never answered on a
  connection it was closing).
"""

from __future__ import annotations

import asyncio
import collections
import socket
from collections.abc import AsyncIterator, Iterable

import httptools

# Hop-by-hop and framing headers: the relay recomputes them for its own client.
DROP_RESPONSE_HEADERS = frozenset({b"content-length", b"transfer-encoding", b"connection",
                                   b"keep-alive", b"content-encoding", b"date", b"server"})
_PAUSE_BYTES = 1 << 20  # a slow reader pauses the upstream socket above this much buffered body


class ConnectFailed(Exception):
    """No connection to the server: it never saw the request."""


class RequestFailed(Exception):
    """The exchange failed after the request may have reached the server."""


class WorkerGone(RequestFailed):
    """The pool broke the exchange off: its server is known to be gone (:meth:`HttpPool.
    break_connections`). Before the answer's head arrived, nothing of it reached anyone."""


class _Stale(Exception):
    """A reused connection ended before any answer byte (server closed it while idle)."""


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: HttpPool,
                 key: tuple[str, int]) -> None:
        self.loop, self.pool, self.key = loop, pool, key
        self.transport: asyncio.Transport | None = None
        self.alive = True
        self.used = False  # has carried an exchange before (a stale close is then retryable)
        self.answer: HttpAnswer | None = None

    # asyncio protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # no Nagle: a request is one write, its answer must not wait
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None:  # bytes nobody asked for: the connection is unusable
            self._drop()
            return
        answer._feed(data)

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self.pool._closed_one(self)
        if self.answer is not None:
            self.answer._lost(exc)

    def _drop(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.close()


class HttpAnswer:
    """Status, headers and body of one exchange (see the module contract)."""

    def __init__(self, conn: _Conn, pool: HttpPool, key: tuple[str, int], timeout: float) -> None:
        self._conn, self._pool, self._key, self._timeout = conn, pool, key, timeout
        self._parser = httptools.HttpResponseParser(self)
        self.status_code = 0
        self.headers: list[tuple[bytes, bytes]] = []  # without hop-by-hop / framing headers
        self._framed = False  # content-length or chunked: the end is known without EOF
        self._head: asyncio.Future[None] = conn.loop.create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        self._complete = False
        self._keep_alive = False
        self._got_bytes = False
        self._closed = False
        self._last = conn.loop.time()
        self._timer = conn.loop.call_later(timeout, self._check_idle)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or name == b"transfer-encoding":
            self._framed = True
        if name not in DROP_RESPONSE_HEADERS:
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status_code = self._parser.get_status_code()
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _PAUSE_BYTES and not self._paused and self._conn.transport:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        # Asked here: the parser resets its flags once the message callback returned.
        self._keep_alive = self._framed and self._parser.should_keep_alive()
        self._complete = True
        self._timer.cancel()
        self._wake()

    # fed by the connection
    def _feed(self, data: bytes) -> None:
        self._got_bytes = True
        self._last = self._conn.loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(RequestFailed(f"malformed answer: {exc!r}"))
            self._conn._drop()

    def _lost(self, exc: Exception | None) -> None:
        if self._complete:
            return
        if self._head.done() and not self._framed and exc is None:
            self.on_message_complete()  # a body delimited by the connection's end
            return
        if not self._got_bytes and self._conn.used:
            self._fail(_Stale())
        else:
            self._fail(RequestFailed(f"connection lost: {exc!r}" if exc else "connection closed"))

    def _check_idle(self) -> None:
        idle = self._conn.loop.time() - self._last
        if idle >= self._timeout:
            self._fail(RequestFailed(f"no data for {self._timeout:g} s"))
            self._conn._drop()
        else:
            self._timer = self._conn.loop.call_later(self._timeout - idle, self._check_idle)

    def _fail(self, exc: Exception) -> None:
        if self._error is None and not self._complete:
            self._error = exc
            self._timer.cancel()
            if not self._head.done():
                self._head.set_exception(exc)
            self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # the caller's side
    async def _wait_head(self) -> None:
        await self._head

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive; :class:`RequestFailed` if the exchange breaks."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered < _PAUSE_BYTES // 2 and self._conn.transport:
                    self._paused = False
                    self._conn.transport.resume_reading()
                yield chunk
            elif self._complete:
                self.close()
                return
            elif self._error is not None:
                raise self._error
            else:
                self._waiter = self._conn.loop.create_future()
                await self._waiter
                self._waiter = None

    async def read(self) -> bytes:
        """The whole body."""
        if not self._complete:
            parts = [chunk async for chunk in self.chunks()]
        else:
            parts = list(self._chunks)
            self._chunks.clear()
            self.close()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Give the connection back (answer complete, keep-alive) or close it."""
        if self._closed:
            return
        self._closed = True
        self._timer.cancel()
        conn = self._conn
        conn.answer = None
        if self._complete and self._keep_alive and conn.alive:
            self._pool._release(self._key, conn)
        else:
            conn._drop()


class HttpPool:
    """Keep-alive connections per (host, port); at most ``max_connections`` open in all."""

    def __init__(self, *, connect_timeout_s: float, read_timeout_s: float,
                 max_connections: int) -> None:
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.max_connections = max_connections
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._open = 0
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._targets: dict[str, tuple[tuple[str, int], bytes]] = {}
        self._live: dict[tuple[str, int], set[_Conn]] = {}  # open, idle or carrying an exchange

    def _target(self, url: str) -> tuple[tuple[str, int], bytes]:
        hit = self._targets.get(url)
        if hit is None:
            parsed = httptools.parse_url(url.encode())
            host = (parsed.host or b"").decode()
            port = parsed.port or (443 if parsed.schema == b"https" else 80)
            if parsed.schema != b"http":
                raise ConnectFailed(f"{url}: only http:// upstreams are supported")
            path = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
            hit = ((host, port), b"POST " + path + b" HTTP/1.1\r\nhost: " +
                   f"{host}:{port}".encode() + b"\r\n")
            if len(self._targets) < 4096:  # a few workers x endpoints; bounded all the same
                self._targets[url] = hit
        return hit

    async def post(self, url: str, body: bytes, headers: Iterable[tuple[str, str]]
                   ) -> HttpAnswer:
        key, start = self._target(url)
        head = [start]
        for k, v in headers:
            head.append(f"{k}: {v}\r\n".encode("latin-1"))
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        data = b"".join(head) + body
        for _ in range(2):  # a second try only after a stale pooled connection
            conn = await self._acquire(key)
            answer = HttpAnswer(conn, self, key, self.read_timeout_s)
            conn.answer = answer
            assert conn.transport is not None
            conn.transport.write(data)
            try:
                await answer._wait_head()
            except _Stale:
                answer.close()
                continue
            except BaseException:
                answer.close()
                raise
            return answer
        raise RequestFailed("the server closed two connections without answering")

    async def _acquire(self, key: tuple[str, int]) -> _Conn:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.alive and conn.transport is not None and not conn.transport.is_closing():
                conn.used = True
                return conn
        if self._open >= self.max_connections:
            self._close_one_idle()  # an idle connection to another server gives way
        while self._open >= self.max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(waiter)
            await waiter
        self._open += 1
        loop = asyncio.get_running_loop()
        made: list[_Conn] = []

        def protocol() -> _Conn:
            made.append(_Conn(loop, self, key))
            return made[-1]

        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(protocol, key[0], key[1])
        except BaseException as exc:
            # A connection that was made reports its loss (and frees its slot) itself.
            if not (made and made[0].transport is not None):
                self._closed_one(None)
            if isinstance(exc, (OSError, TimeoutError)):
                raise ConnectFailed(f"{key[0]}:{key[1]}: {exc!r}") from exc
            raise
        self._live.setdefault(key, set()).add(conn)
        return conn

    def break_connections(self, url: str, reason: str) -> int:
        """Close every connection to ``url``'s server now (idle ones too), failing the
        exchanges they carry with :class:`WorkerGone` (``reason``): for a server known to be
        gone, whose connections would otherwise wait for a FIN that a dead host never sends.
        Returns how many."""
        conns = list(self._live.get(self._target(url)[0], ()))
        for conn in conns:
            if conn.answer is not None:
                conn.answer._fail(WorkerGone(reason))
            conn._drop()
        return len(conns)

    def _close_one_idle(self) -> None:
        for conns in self._idle.values():
            while conns:
                conn = conns.pop()
                if conn.alive:
                    conn._drop()  # counted as closed when the loop reports it lost
                    return

    def _release(self, key: tuple[str, int], conn: _Conn) -> None:
        self._idle.setdefault(key, []).append(conn)

    def _closed_one(self, conn: _Conn | None) -> None:
        if conn is not None:
            live = self._live.get(conn.key)
            if live is not None:
                live.discard(conn)
                if not live:
                    del self._live[conn.key]
        self._open -= 1
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn._drop()
        self._idle.clear()
