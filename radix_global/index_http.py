"""``/metrics`` of the standalone index service (``radix-global index serve --metrics-port``):
the index's size and refusals and its KV event feeds (``index_metrics.py``), on a listener
beside the gRPC server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from radix_global.http_listener import Listener, listen
from radix_global.index_metrics import IndexCollector
from radix_global.subscriber import SubscriberStats


async def serve_metrics(host: str, port: int, index: Callable[[], Any],
                        feeds: Callable[[], SubscriberStats | None]) -> Listener:
    """``/metrics`` on ``host:port`` (0: any free port) of the index ``index()`` reports (its
    ``stats()``, read at each scrape) and of ``feeds()``, its event subscriber's stats."""
    registry = CollectorRegistry()
    registry.register(IndexCollector(index, feeds))

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    app = Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])
    return await listen(app, host, port, "index-metrics")
