"""Who may call the index service's HTTP APIs, and with how many bytes.

The HTTP counterpart of :mod:`radix_global.service_guard` (gRPC), with the same rule
(``docs/interfaces.md``, "Index service"): with a token configured every guarded route needs
``Authorization: Bearer <token>`` (compared in constant time); without one only a loopback peer
that sent no forwarding header may call, since a reverse proxy on this host would be a loopback
peer speaking for anyone. The server must take the peer from its socket, never from a header
(uvicorn's ``proxy_headers`` off).

This module knows nothing of the routes behind it or the index.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request

from radix_global.endpoints import is_loopback_address

# Headers by which a proxy says who the client was (as router/http/admin.py): with them, a
# loopback peer may be a proxy on this host speaking for anyone.
FORWARDING_HEADERS = frozenset({
    "forwarded", "via", "x-real-ip", "true-client-ip", "x-client-ip", "client-ip",
    "x-cluster-client-ip", "cf-connecting-ip", "fastly-client-ip", "x-original-forwarded-for"})


def proxied(request: Request) -> bool:
    """The request carries a header by which a proxy names another client."""
    return any(k in FORWARDING_HEADERS or k.startswith("x-forwarded-") for k in request.headers)


def loopback_peer(request: Request) -> bool:
    """The socket's peer is this machine."""
    return request.client is not None and is_loopback_address(request.client.host)


def local_caller(request: Request) -> bool:
    """A loopback peer that speaks for itself (no forwarding header)."""
    return loopback_peer(request) and not proxied(request)


def bearer_matches(authorization: str, token: str) -> bool:
    """``authorization`` (the header's value) is ``Bearer <token>``, compared in constant time."""
    return hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode())


def authorized(request: Request, admin_token: str | None) -> bool:
    """The caller may write or query keys (the rule above)."""
    if admin_token is None:
        return local_caller(request)
    return bearer_matches(request.headers.get("authorization", ""), admin_token)


def refusal(admin_token: str | None) -> str:
    """Why :func:`authorized` said no, for the 401's message."""
    if admin_token is not None:
        return "missing or wrong admin token (header 'Authorization: Bearer <token>')"
    return "no admin token configured: only loopback clients, without forwarding headers"


async def read_body(request: Request, limit: int) -> bytes | None:
    """The whole body, or None when it is (or says it is) larger than ``limit`` bytes; a
    ``content-length`` that is no number counts as too large. Reads no further than ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
