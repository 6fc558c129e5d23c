"""The router's ASGI app (starlette) and its server (uvicorn).

Front end: OpenAI ``/v1/completions``, ``/v1/chat/completions`` (SSE streaming passed through),
SGLang ``/generate``, ``/v1/models``, ``/health``, ``/metrics``; admin API under ``/admin``
(``router/http/admin.py``). The request path is in ``router/request/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from radix_global.http_listener import listen as listen_beside
from router.http.admin import admin_routes, guard
from router.http.dashboard import dashboard_routes
from router.http.shared_prefixes import shared_prefix_routes
from router.keying.request_body import RequestKind
from router.request.handler import handle
from router.state import RouterState
from router.transport.errors import ErrorType, error_response

log = logging.getLogger("radix_global.router")


def build_app(state: RouterState) -> ASGIApp:
    """The router's ASGI app. The three inference routes are dispatched before starlette's
    router and middleware (a dict lookup instead of route matching and two middleware layers per
    request: a visible share of a forwarded request's router time); the rest is starlette's."""
    async def _guarded(scope: Scope, receive: Receive, send: Send, kind: RequestKind, path: str
                       ) -> None:
        try:
            response = await handle(state, Request(scope, receive), kind, path)
        except Exception as exc:  # a bug must cost one request, never the router
            log.exception("request to %s failed", path)
            response = error_response(500, f"router error: {exc!r}", ErrorType.INTERNAL)
        status = 500
        try:
            await response(scope, receive, send)
            # the status the client got: a relay knows it once it answered (499: it left first)
            status = getattr(response, "status_code", 200)
        finally:
            state.metrics.request(path, status).inc()

    async def models(request: Request) -> Response:
        data = [{"id": m, "object": "model", "owned_by": "radix-global", "namespace": ns}
                for m, ns in sorted(state.registry.models().items())]
        return JSONResponse({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        healthy = any(e.accepting for e in state.registry.all())
        return JSONResponse({"status": "ok" if healthy else "no_workers",
                             "workers": len(state.registry)}, status_code=200 if healthy else 503)

    async def ready(request: Request) -> Response:
        """Readiness (``/health`` is liveness): the shared view read, when there is one, and a
        worker to route to; a load balancer sends clients only to ready routers."""
        waiting = [] if state.view.ready else ["coordination"]
        if not any(e.accepting for e in state.registry.all()):
            waiting.append("workers")
        return JSONResponse({"ready": not waiting, "waiting_for": waiting,
                             "workers": len(state.registry)},
                            status_code=503 if waiting else 200)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        *([] if state.config.listen.metrics_port else metrics_routes(state)),
        *admin_routes(state),
        *dashboard_routes(state, lambda fn: guard(state, fn)),
        *shared_prefix_routes(state),
    ]
    rest = Starlette(routes=routes, lifespan=lifespan)
    inference = {"/v1/completions": (RequestKind.COMPLETION, "/v1/completions"),
                 "/v1/chat/completions": (RequestKind.CHAT, "/v1/chat/completions"),
                 "/generate": (RequestKind.GENERATE, "/generate")}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        hit = inference.get(scope["path"]) if scope["type"] == "http" else None
        if hit is None or scope["method"] != "POST":
            await rest(scope, receive, send)
            return
        await _guarded(scope, receive, send, *hit)

    return app


def metrics_routes(state: RouterState) -> list[Route]:
    """``GET /metrics``: on the client port, or on a listener of its own (``--metrics-port``),
    so that the client-facing port need not expose it."""

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return [Route("/metrics", metrics, methods=["GET"])]


def serve(state: RouterState) -> None:
    """Run the router until it is stopped (SIGINT/SIGTERM): the client port and, with
    ``metrics_port``, the metrics listener beside it in the same event loop."""
    import uvicorn

    from router.transport.http_server import server_config

    config = state.config
    listen = config.listen
    main = uvicorn.Server(server_config(build_app(state), listen.host, listen.port,
                                        listen.log_level, config.client))
    metrics_port = listen.metrics_port
    if not metrics_port:
        main.run()
        return

    async def both() -> None:
        # the metrics listener leaves the stop signals to the main server, and stops with it
        metrics = await listen_beside(Starlette(routes=metrics_routes(state)), listen.host,
                                      metrics_port, "router-metrics")
        try:
            await main.serve()
        finally:
            await metrics.stop()

    with asyncio.Runner(loop_factory=main.config.get_loop_factory()) as runner:
        runner.run(both())
