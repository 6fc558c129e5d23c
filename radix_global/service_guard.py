"""Who may call the index service, and with what bytes (issue 35).

The contract, enforced before any RPC touches the index:

* Bytes that are no valid request message are refused with INVALID_ARGUMENT (``rg-reason``
  ``invalid``) by :class:`RefuseMalformed`, before any servicer method or :func:`authorize` sees
  them; no traceback is logged for a client's bad bytes.
* Every call that writes, and every query that answers about page keys (Match, HotPrefixes),
  is passed by :func:`authorize`: with a token configured it needs metadata
  ``authorization: Bearer <token>`` (compared in constant time), without one a loopback peer
  (:func:`is_loopback_peer`); otherwise UNAUTHENTICATED (``rg-reason`` ``unauthenticated``).
  Tenant salts are predictable and the service cannot tell a salted key from a plain one, so an
  open Match would confirm a guess at a tenant's prompt. Stats stays open: aggregate counts only.
* Every refusal goes out through :func:`fail`: a status code, a message and the ``rg-reason``
  trailer (``wire.REFUSALS``).

This module knows nothing of the servicer or the index; ``radix_global.service`` imports it, never
the other way round.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc

from radix_global.endpoints import is_loopback_address
from radix_global.wire import REASON_KEY


def is_loopback_peer(peer: str) -> bool:
    """A gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``) that
    can only be this machine."""
    if peer.startswith("unix:"):
        return True
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return False
    return is_loopback_address(rest.rsplit(":", 1)[0])


async def fail(context: grpc.aio.ServicerContext, code: grpc.StatusCode, msg: str,
               reason: str) -> NoReturn:
    """Abort the call with ``code``, ``msg`` and the ``rg-reason`` trailer ``reason``."""
    await context.abort(code, msg, trailing_metadata=((REASON_KEY, reason),))
    raise AssertionError("abort returns only by raising")


async def authorize(context: grpc.aio.ServicerContext, admin_token: str | None) -> None:
    """Return when the caller may write or query keys; abort UNAUTHENTICATED otherwise."""
    if admin_token is None:
        peer = context.peer()
        if not is_loopback_peer(peer):
            await fail(context, grpc.StatusCode.UNAUTHENTICATED,
                       "no admin token configured: admin calls and key queries only from "
                       f"loopback ({peer})", "unauthenticated")
        return
    sent = dict(context.invocation_metadata() or ()).get("authorization", "")
    if not hmac.compare_digest(str(sent).encode(), f"Bearer {admin_token}".encode()):
        await fail(context, grpc.StatusCode.UNAUTHENTICATED,
                   "missing or wrong admin token (metadata 'authorization: Bearer <token>')",
                   "unauthenticated")


class _Malformed:
    """What the deserializer of :class:`RefuseMalformed` hands on for bytes that do not parse."""

    def __init__(self, error: Exception) -> None:
        self.message = f"malformed request message: {str(error)[:200]}"


class RefuseMalformed(grpc.aio.ServerInterceptor):
    """Bytes that are no valid request message get INVALID_ARGUMENT (``rg-reason`` invalid).

    A deserializer that raises makes grpc answer UNKNOWN and log a traceback, and it has no
    context to abort with; so the wrapped deserializer returns a :class:`_Malformed` marker and
    the wrapped handler refuses it before any servicer method (or authorization) sees it."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler: Any = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler  # unknown method (UNIMPLEMENTED), or a kind this service has none of
        parse, behavior = handler.request_deserializer, handler.unary_unary

        def deserialize(data: bytes) -> Any:
            try:
                return parse(data)
            except Exception as exc:  # protobuf's DecodeError, whatever the bytes
                return _Malformed(exc)

        async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                await fail(context, grpc.StatusCode.INVALID_ARGUMENT, request.message, "invalid")
            return await behavior(request, context)

        return handler._replace(request_deserializer=deserialize, unary_unary=answer)
