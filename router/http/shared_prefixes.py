"""``/admin/shared-prefixes`` (the platform prefixes every tenant reuses) and
``/admin/pool-aliases`` (what a worker's pool backend asks): ``docs/interfaces.md``,
"Shared platform prefixes across isolated tenants". Admin-authenticated like the rest of
``/admin``."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from radix_global.keys import storage_page_key
from radix_global.types import Namespace, PoolPageKey
from router.http.admin import guard
from router.keying.prefix_specs import SharedPrefixError, SharedPrefixExists, parse_spec
from router.request.handler import read_body, tokenizer_for
from router.state import RouterState
from router.transport.errors import error_response

# Above the 64 KiB of other admin bodies (interfaces.md,
# "What a client controls, and what the router decides"): a 65,536-token prefix as JSON ids
PREFIX_BODY_MAX_BYTES = 1 << 20
_HEX = frozenset("0123456789abcdef")


def shared_prefix_routes(state: RouterState) -> list[Route]:
    prefixes = state.shared_prefixes

    async def listing(request: Request) -> Response:
        return JSONResponse({"shared_prefixes": [s.to_json() for s in prefixes.specs()]})

    async def add(request: Request) -> Response:
        body = await read_body(request, PREFIX_BODY_MAX_BYTES, "shared prefix")
        try:
            data: Any = json.loads(body)
        except (ValueError, RecursionError):
            return error_response(400, "body must be a JSON object")
        try:
            spec = parse_spec(data.get("name") if isinstance(data, dict) else None, data)
            encoder = None
            if spec.token_ids is None:  # tokenized now (off the loop), refused now if it must be
                entry = next(iter(state.registry.for_model(spec.model)), None)
                encoder = await tokenizer_for(state, entry) if entry is not None else None
            await prefixes.register(spec, encoder)
        except SharedPrefixExists as exc:
            return error_response(409, str(exc))
        except SharedPrefixError as exc:
            return error_response(400, str(exc))
        if state.view.writes is not None:  # every router shares it
            state.view.writes.prefix_added(spec)
        return JSONResponse(spec.to_json(), status_code=201)

    async def remove(request: Request) -> Response:
        name = request.path_params["name"]
        if not prefixes.remove(name):
            return error_response(404, f"no shared prefix {name!r}")
        state.aliases.forget(name)
        if state.view.writes is not None:
            state.view.writes.prefix_removed(name)
        return JSONResponse({"removed": name})

    async def aliases(request: Request) -> Response:
        namespace, head = request.query_params.get("namespace"), request.query_params.get("head")
        if not namespace or not head or len(head) != 64 or not set(head) <= _HEX:
            return error_response(400, "need ?namespace=<namespace>&head=<64 lowercase hex "
                                  "digits: the chain's first storage key>")
        ns, key = Namespace(namespace), PoolPageKey(head)
        pairs = state.aliases.pairs(ns, key)
        writes = state.view.writes
        # recorded by another router (the one that keyed the request): asked of the service
        if not pairs and writes is not None and len(prefixes) and await writes.alias_lookup(
                state.aliases, ns, storage_page_key(key)):
            pairs = state.aliases.pairs(ns, key)
        # "prefixes": how many are registered at all; with none a backend stops asking a while
        return JSONResponse({"pairs": [list(p) for p in pairs], "prefixes": len(prefixes)})

    return [
        Route("/admin/shared-prefixes", guard(state, listing), methods=["GET"]),
        Route("/admin/shared-prefixes", guard(state, add), methods=["POST"]),
        Route("/admin/shared-prefixes/{name}", guard(state, remove), methods=["DELETE"]),
        Route("/admin/pool-aliases", guard(state, aliases), methods=["GET"]),
    ]
