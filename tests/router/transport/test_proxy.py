"""Proxy: failure classes against real sockets, disconnect watching, SSE helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from http_peer import ServerThread, Upstream, free_port

from router.transport.bodies import last_sse_event
from router.transport.errors import sse_error
from router.transport.http_server import DISCONNECT_HOOK, DisconnectHook
from router.transport.proxy import (
    ClientGone,
    Proxy,
    ProxyConfig,
    UpstreamFailed,
    UpstreamUnavailable,
    forward_headers,
    until_disconnect,
)


def test_refused_connection_is_retryable_class():
    async def go() -> None:
        proxy = Proxy(ProxyConfig(connect_timeout_s=1))
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
        proxy = Proxy(ProxyConfig())
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

        assert await until_disconnect({}, receive, asyncio.sleep(0, result=7)) == 7
        cancelled = asyncio.Event()

        async def slow() -> None:
            try:
                await asyncio.sleep(30)
            finally:
                cancelled.set()

        asyncio.get_running_loop().call_later(0.05, gone.set)
        with pytest.raises(ClientGone):
            await until_disconnect({}, receive, slow())
        assert cancelled.is_set()

    asyncio.run(go())


def test_until_disconnect_with_the_servers_hook():
    """Under the router's server the connection's hook cancels the work (no watcher task; the
    ``receive`` given would never answer)."""
    async def never() -> dict:
        await asyncio.sleep(3600)
        return {}

    async def go() -> None:
        hook = DisconnectHook()
        scope = {"extensions": {DISCONNECT_HOOK: hook}}
        assert await until_disconnect(scope, never, asyncio.sleep(0, result=7)) == 7
        assert hook._callbacks == []  # discarded when done
        asyncio.get_running_loop().call_later(0.05, hook.fire)
        tasks_before = len(asyncio.all_tasks())
        with pytest.raises(ClientGone):
            await until_disconnect(scope, never, asyncio.sleep(30))
        assert len(asyncio.all_tasks()) == tasks_before
        # a connection lost before the answer began: gone at once
        with pytest.raises(ClientGone):
            await until_disconnect(scope, never, asyncio.sleep(30))

    asyncio.run(asyncio.wait_for(go(), 10))


def test_headers_and_sse_helpers():
    fwd = forward_headers([(b"authorization", b"Bearer k"), (b"host", b"x"),
                           (b"content-length", b"3"), (b"authorization", b"Bearer other")])
    assert fwd == {"authorization": "Bearer k", "content-type": "application/json"}
    err = sse_error("boom").decode()
    assert json.loads(err.split("\n\n")[0][5:])["error"]["message"] == "boom"
    assert err.endswith("data: [DONE]\n\n")
    tail = b'data: {"a": 1}\n\ndata: {"usage": {"prompt_tokens": 3}}\n\ndata: [DONE]\n\n'
    assert last_sse_event(tail) == {"usage": {"prompt_tokens": 3}}
    assert last_sse_event(b"garbage") is None


async def _raw_server(handler) -> tuple[asyncio.Server, str]:
    """A loopback server speaking raw bytes (``handler(reader, writer)``), for wire cases."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


def test_whole_answer_headers_and_keepalive_reuse():
    """One connection carries several exchanges; framing/hop-by-hop headers are dropped."""
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                request = await _read_request(reader)
                assert request.startswith(b"POST /generate HTTP/1.1\r\n")
                assert b"\r\nauthorization: Bearer k\r\n" in request
                assert request.endswith(b'{"a":1}')
                writer.write(b"HTTP/1.1 200 OK\r\nserver: x\r\ncontent-type: application/json"
                             b"\r\ncontent-length: 5\r\nx-extra: 1\r\n\r\nhello")
        except asyncio.IncompleteReadError:
            writer.close()

    async def go() -> None:
        server, url = await _raw_server(handler)
        proxy = Proxy(ProxyConfig())
        try:
            for _ in range(3):
                resp = await proxy.post(f"{url}/generate", b'{"a":1}',
                                        {"authorization": "Bearer k"})
                assert (resp.status_code, resp.content) == (200, b"hello")
                assert resp.headers == [(b"content-type", b"application/json"),
                                        (b"x-extra", b"1")]
        finally:
            await proxy.close()
            server.close()

    asyncio.run(go())
    assert len(connections) == 1


def test_stale_keepalive_connection_is_retried_on_a_fresh_one():
    """The server closes the pooled connection right after answering: the next request must not
    fail (it never reached a live server), it goes out on a new connection."""
    served: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        served.append(1)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read(1)  # the next request's first byte (or EOF): close without answering
        writer.close()

    async def go() -> None:
        server, url = await _raw_server(handler)
        proxy = Proxy(ProxyConfig())
        try:
            for _ in range(3):
                assert (await proxy.post(f"{url}/generate", b"{}", {})).content == b"ok"
        finally:
            await proxy.close()
            server.close()

    asyncio.run(go())
    assert len(served) == 3


def test_broken_stream_and_silence_are_upstream_failures():
    async def mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
        await writer.drain()
        writer.transport.abort()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def go() -> None:
        broken, url = await _raw_server(mid_stream)
        quiet, quiet_url = await _raw_server(silent)
        proxy = Proxy(ProxyConfig(request_timeout_s=0.2))
        try:
            resp = await proxy.open_stream(f"{url}/generate", b"{}", {})
            got = []
            with pytest.raises(UpstreamFailed):
                async for chunk in resp.aiter_raw():
                    got.append(chunk)
            await resp.aclose()
            assert got == [b"data: "]
            with pytest.raises(UpstreamFailed):
                await proxy.post(f"{quiet_url}/generate", b"{}", {})
        finally:
            await proxy.close()
            broken.close()
            quiet.close()

    asyncio.run(go())


def test_connection_limit_an_idle_connection_gives_way():
    """At max_connections, a request to another server closes an idle pooled connection
    instead of waiting forever for it."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await _read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        except asyncio.IncompleteReadError:
            writer.close()

    async def go() -> None:
        a, url_a = await _raw_server(handler)
        b, url_b = await _raw_server(handler)
        proxy = Proxy(ProxyConfig(max_connections=1))
        try:
            for url in (url_a, url_b, url_a):
                resp = await asyncio.wait_for(proxy.post(f"{url}/generate", b"{}", {}), 5)
                assert resp.content == b"ok"
        finally:
            await proxy.close()
            a.close()
            b.close()

    asyncio.run(go())


def test_a_dead_workers_exchanges_end_at_once_when_it_is_broken_off():
    """A host that vanished sends no FIN: without break_worker its exchanges would wait for the
    read timeout (600 s by default); with it they fail now: one still waiting for its answer as
    retryable (its worker is gone), one streaming as failed; an idle pooled connection is
    closed too; other servers' are untouched; the pool's accounting comes back to zero."""
    from router.transport.proxy import UpstreamGone

    received: list[bytes] = []

    async def hangs_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                               ) -> None:
        request = await _read_request(reader)
        received.append(request)
        if b"stream" in request:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
            await writer.drain()
        await asyncio.sleep(30)

    async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(0.5)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    async def go() -> None:
        dead, url = await _raw_server(hangs_mid_stream)
        alive, alive_url = await _raw_server(answers)
        url = url.replace("127.0.0.1", "LOCALHOST")  # one key for the pool and break_worker
        proxy = Proxy(ProxyConfig(request_timeout_s=60))
        try:
            stream = await proxy.open_stream(f"{url}/generate", b'{"stream": true}', {})
            whole = asyncio.create_task(proxy.post(f"{url}/generate", b"{}", {}))
            other = asyncio.create_task(proxy.post(f"{alive_url}/generate", b"{}", {}))
            for _ in range(100):  # both exchanges reached the dead host (bounded: 5 s)
                if len(received) >= 2:
                    break
                await asyncio.sleep(0.05)
            assert proxy.break_worker(url, "worker w left the cluster") == 2
            with pytest.raises(UpstreamGone, match="left the cluster"):
                await asyncio.wait_for(whole, 2)
            got = []
            with pytest.raises(UpstreamFailed, match="left the cluster"):
                async for chunk in stream.aiter_raw():
                    got.append(chunk)
            await stream.aclose()
            assert got == [b"data: "]
            assert (await asyncio.wait_for(other, 5)).content == b"ok"
            assert proxy.break_worker(url, "again") == 0
            assert proxy.break_worker(alive_url, "idle one") == 1  # its pooled connection
            await asyncio.sleep(0.1)
            assert proxy._pool._open == 0 and not proxy._pool._live
        finally:
            await proxy.close()
            dead.close()
            alive.close()

    asyncio.run(go())


def test_until_disconnect_never_returns_for_a_client_that_left():
    """Work that swallows the cancel of a disconnect (as ``asyncio.wait_for`` of Python 3.11 does
    when its future is resolved in the same turn) still ends in :class:`ClientGone`: the caller
    must not go on to route a request nobody waits for (issue 35, item 4)."""
    async def never() -> dict:
        await asyncio.sleep(3600)
        return {}

    async def go() -> None:
        hook = DisconnectHook()
        scope = {"extensions": {DISCONNECT_HOOK: hook}}

        async def swallows() -> int:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(30)
            return 7

        asyncio.get_running_loop().call_later(0.05, hook.fire)
        with pytest.raises(ClientGone):
            await until_disconnect(scope, never, swallows())
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0

    asyncio.run(asyncio.wait_for(go(), 10))
