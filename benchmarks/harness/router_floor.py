"""The floor under our router's overhead: the same HTTP stack forwarding with no routing at all.

``benchmarks/micro/router_overhead.py`` measures this as a target of its own, ``http-floor``: the
server our router runs on (uvicorn with ``router.transport.http_server``'s protocol) and the client
it forwards with (``router.transport.http_client.HttpPool``), passing each POST body unchanged to
one
upstream and the answer back. No parsing, tokenizing, page keys, policy or metrics. Its added
latency is what any router built on this stack pays before doing anything; our router's added
latency minus this is the cost of the routing work itself.

Run: ``python -m benchmarks.harness.router_floor --upstream URL --port P`` (loopback only).
"""

from __future__ import annotations

import argparse
from typing import Any

from router.transport.http_client import HttpPool
from router.transport.http_server import server_config


def floor_app(upstream: str) -> Any:
    pool: HttpPool | None = None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal pool
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if pool is None:  # created on the server's event loop
            pool = HttpPool(connect_timeout_s=5, read_timeout_s=60, max_connections=256)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        answer = await pool.post(upstream + scope["path"], b"".join(chunks),
                                 [("content-type", "application/json")])
        body = await answer.read()
        await send({"type": "http.response.start", "status": answer.status_code,
                    "headers": [*answer.headers, (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    uvicorn.Server(server_config(floor_app(args.upstream), "127.0.0.1", args.port,
                                 "warning")).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
