"""The router's uvicorn setup: writes of one loop step coalesced, served answers intact."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import uvicorn
from http_peer import ServerThread, Upstream, free_port

from router.config import RouterConfig
from router.http.app import build_app
from router.state import RouterState
from router.transport.http_server import CoalescingTransport, server_config


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return f"info:{name}"


def test_writes_of_one_step_go_out_once_and_close_flushes_first():
    async def go() -> _Recorder:
        raw = _Recorder()
        t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert raw.writes == []
        t.write(b"body")  # the second write of the step: both leave now, together
        assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        t.write(b"chunk")  # alone in its step: leaves when the step ends
        await asyncio.sleep(0)
        assert raw.writes[-1] == b"chunk"
        await asyncio.sleep(0)
        assert len(raw.writes) == 2
        t.write(b"last")
        t.close()  # before the loop step ends: flushed, then closed
        assert raw.writes[-1] == b"last" and raw.closed
        assert t.get_extra_info("peername") == "info:peername"
        return raw

    asyncio.run(go())


def test_router_served_with_its_config(tokenizer_dir: str):
    peer = Upstream(model_path=tokenizer_dir)
    upstream = ServerThread(peer.app).start()
    state = RouterState(RouterConfig.from_options(workers=(upstream.url,), policy="round_robin",
                                                  health_check_interval_s=0.2,
                                                  profile_max_tokens=0))
    port = free_port()
    server = uvicorn.Server(server_config(build_app(state), "127.0.0.1", port, "warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "router did not come up"
                time.sleep(0.05)
            for _ in range(3):  # whole answers on one keep-alive connection
                r = client.post("/generate", json={"input_ids": [5, 6, 7]})
                assert r.status_code == 200 and r.json()["text"] == "hello"
                assert r.headers["content-length"] == str(len(r.content))
                assert r.headers["x-radix-worker"]
            with client.stream("POST", "/generate",
                               json={"input_ids": [5, 6], "stream": True}) as s:
                body = b"".join(s.iter_raw())
            events = [e for e in body.split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]" and len(events) == peer.chunks + 1
            assert json.loads(events[0][5:])["text"] == "x"
            assert client.post("/generate", content=b"{nope").status_code == 400
            assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        upstream.stop()
