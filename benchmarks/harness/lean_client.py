"""A lean HTTP/1.1 load client: ``concurrency`` keep-alive connections sending one request over
and over, timing each answer.

Lean on purpose (asyncio streams, the request bytes built once, httptools parsing the answer):
it shares the machine with the routers it measures, so its own CPU must stay small (httpx's
swamped the 32-client numbers of ``benchmarks/micro/router_overhead.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any


class _Exchange:
    """httptools callbacks of one answer (the client side of the benchmark)."""

    def __init__(self) -> None:
        import httptools

        self.done = False
        self.status = 0
        self.size = 0
        self.parser = httptools.HttpResponseParser(self)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.size += len(body)

    def on_message_complete(self) -> None:
        self.done = True


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes,
                   label: str) -> float:
    """Send one pre-encoded request on a keep-alive connection and read its whole answer; the
    seconds it took. Raises on a closed connection or a status other than 200."""
    t = time.perf_counter()
    writer.write(request)
    ex = _Exchange()
    while not ex.done:
        data = await reader.read(65536)
        if not data:
            raise RuntimeError(f"{label}: connection closed")
        ex.parser.feed_data(data)
    took = time.perf_counter() - t
    if ex.status != 200:
        raise RuntimeError(f"{label}: HTTP {ex.status}")
    return took


async def run_batch(base: str, path: str, body: dict[str, Any], concurrency: int, total: int
                    ) -> list[float]:
    """``total`` POSTs from ``concurrency`` keep-alive connections; latency of each.

    A lean client (asyncio streams, the request bytes built once, httptools parsing the answer),
    so that the client's own CPU, which shares the machine with the routers, stays small."""
    host, port = base.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    request = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\n"
               f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
               ).encode() + payload
    lat: list[float] = []
    per = total // concurrency

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for _ in range(per):
                lat.append(await exchange(reader, writer, request, f"{base}{path}"))
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat
