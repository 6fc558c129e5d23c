"""``/dashboard``: the live page an operator looks at, and ``/admin/hot``, the hottest prefixes
it shows (``docs/operations.md``, "The page").

The page is one static file shipped in the package (``static/dashboard.html``: no build step, no
outside network); its script reads ``/admin/stats`` and ``/admin/hot`` every few seconds and
keeps the last minutes in the browser, so the router serves numbers, not pages. Both are behind
the admin token: a browser asks for it (HTTP Basic, the token as the password).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from radix_global.ops import HotPrefix, IndexRefusal
from radix_global.types import Namespace
from router.state import RouterState

HOT_TOP_K = 10  # prefixes per model on the page
HOT_REFRESH_S = 10.0  # the hottest prefixes walk the whole index: at most this often
HOT_WALK_MAX_NODES = 200_000  # the embedded index is walked on the event loop: up to this
_PAGE = "static/dashboard.html"


def dashboard_routes(state: RouterState, guarded: Any) -> list[Route]:
    page = resources.files("router.http").joinpath(_PAGE).read_text()

    async def dashboard(request: Request) -> Response:
        return HTMLResponse(page, headers={"cache-control": "no-store"})

    cached: list[Any] = [None, -HOT_REFRESH_S]  # (answer, when): a walk of every index node

    async def hot(request: Request) -> Response:
        now = state.clock()
        if now - cached[1] >= HOT_REFRESH_S:
            models = sorted(state.registry.models().items())  # read on the loop
            if state.index.remote:  # blocking gRPC: off the event loop
                cached[0] = await asyncio.to_thread(hot_prefixes, state, models, HOT_TOP_K)
            elif state.index.stats().get("nodes", 0) > HOT_WALK_MAX_NODES:
                # the embedded index is the loop's own (its events are applied there): a walk
                # of every node would stall routing
                cached[0] = {"unavailable": f"the embedded index has over {HOT_WALK_MAX_NODES} "
                             "nodes: run the index service to see its hottest prefixes"}
            else:
                cached[0] = hot_prefixes(state, models, HOT_TOP_K)
            cached[1] = now
        return JSONResponse(cached[0])

    return [Route("/dashboard", guarded(dashboard), methods=["GET"]),
            Route("/admin/hot", guarded(hot), methods=["GET"])]


def hot_prefixes(state: RouterState, models: Sequence[tuple[str, str]], top_k: int
                 ) -> dict[str, list[dict[str, Any]]]:
    """Per (model, namespace) of ``models``, its ``top_k`` hottest prefixes by the index's
    decayed hit rate: the prefix's last page key (a hash, never prompt text), its length, and
    how many holders have all of it on each tier."""
    out: dict[str, list[dict[str, Any]]] = {}
    now = state.clock()
    for model, namespace in models:
        ns = Namespace(namespace)
        try:
            hot = state.index.hot_prefixes(ns, top_k, now)
        except IndexRefusal:  # no worker of it has registered with the index yet
            hot = []
        out[model] = [_entry(state, ns, h, now) for h in hot]
    return out


def _entry(state: RouterState, ns: Namespace, h: HotPrefix, now: float) -> dict[str, Any]:
    page_size = state.registry.page_size(ns) or 1
    tiers = {"gpu": 0, "host": 0, "pool": 0}
    try:
        match = state.index.direct_view.match(ns, list(h.keys), now)
    except IndexRefusal:
        match = None
    for held in (match.matched.values() if match is not None else ()):
        tiers["gpu"] += held.gpu >= h.pages
        tiers["host"] += held.host >= h.pages
        tiers["pool"] += held.pool >= h.pages
    return {"key": f"{int(h.keys[-1]) & (2**64 - 1):016x}", "pages": h.pages,
            "tokens": h.pages * page_size, "hit_rate": round(h.hit_rate, 4),
            "holders": h.holders, "tiers": tiers}
