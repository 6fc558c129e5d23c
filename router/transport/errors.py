"""The OpenAI error body, the one shape every error the router answers takes.

``{"error": {"message": ..., "type": ..., "param": null, "code": <HTTP status>}}``: raised as
an :class:`HttpError` where a request is refused and answered once, as a whole JSON answer
(:func:`error_response` for starlette, :func:`send_error` for a raw ASGI ``send``), or as the last
event of a stream that broke after bytes were relayed (:func:`sse_error`, then ``[DONE]``). An
engine's own error (SGLang's and older vLLM's ``{"object": "error", ...}``) is relayed in the same
shape (:func:`openai_error_body`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec
from starlette.responses import Response
from starlette.types import Send


class ErrorType(StrEnum):
    """The ``type`` field: what kind of failure, for clients that branch on it."""

    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    MODEL_NOT_FOUND = "model_not_found"
    CONTEXT_LENGTH = "context_length_exceeded"
    RATE_LIMIT = "rate_limit_exceeded"
    UNAVAILABLE = "service_unavailable"
    UPSTREAM = "upstream_error"
    INTERNAL = "internal_error"


class HttpError(Exception):
    """A refusal, raised where it is decided; the request path turns it into the answer once
    (:meth:`response`, or :func:`send_error` on a raw ASGI channel)."""

    def __init__(self, status: int, message: str, kind: ErrorType = ErrorType.INVALID_REQUEST,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers

    def response(self) -> Response:
        return error_response(self.status, self.message, self.kind, self.headers)

    async def send(self, send: Send) -> None:
        await send_error(send, self.status, self.message, self.kind, self.headers)


def error_body(status: int, message: str, kind: ErrorType = ErrorType.INVALID_REQUEST,
               param: str | None = None) -> bytes:
    return msgspec.json.encode({"error": {"message": message, "type": kind.value,
                                          "param": param, "code": status}})


def openai_error_body(raw: bytes, status: int) -> bytes | None:
    """An engine's error answer ``raw`` (HTTP ``status``; 0: take the body's ``code``) in the
    router's shape, or None when it is not an engine error object (relayed as it is)."""
    try:
        return engine_error(msgspec.json.decode(raw), status)
    except (msgspec.DecodeError, RecursionError):
        return None


def engine_error(answer: Any, status: int) -> bytes | None:
    """:func:`openai_error_body` of a decoded answer: SGLang's and older vLLM's
    ``{"object": "error", ...}``, or SGLang's stream event ``{"error": {"object": "error", ...}}``.
    The message and ``param`` are the engine's; the type is the router's for that status (a
    prompt over the context length is ``context_length_exceeded``, as the router's own check
    says)."""
    inner = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(inner, dict) and inner.get("object") == "error":
        answer = inner
    if not isinstance(answer, dict) or answer.get("object") != "error" \
            or not isinstance(answer.get("message"), str):
        return None
    code = answer.get("code")
    status = status or (code if isinstance(code, int) and 400 <= code < 600 else 500)
    message = answer["message"]
    param = answer.get("param") if isinstance(answer.get("param"), str) else None
    return error_body(status, message, _type_of(status, message), param)


def _type_of(status: int, message: str) -> ErrorType:
    if "context length" in message.lower() or "context_length" in message.lower():
        return ErrorType.CONTEXT_LENGTH
    return {401: ErrorType.AUTHENTICATION, 403: ErrorType.AUTHENTICATION,
            404: ErrorType.MODEL_NOT_FOUND, 429: ErrorType.RATE_LIMIT,
            503: ErrorType.UNAVAILABLE}.get(
        status, ErrorType.INVALID_REQUEST if status < 500 else ErrorType.UPSTREAM)


def error_response(status: int, message: str, kind: ErrorType = ErrorType.INVALID_REQUEST,
                   headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(status, message, kind), status_code=status, headers=headers,
                    media_type="application/json")


async def send_error(send: Send, status: int, message: str,
                     kind: ErrorType = ErrorType.INVALID_REQUEST,
                     headers: dict[str, str] | None = None) -> None:
    """The whole error answer on a raw ASGI ``send`` (nothing may have been sent before)."""
    body = error_body(status, message, kind)
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_failure(send: Send, started: bool, stream: bool, exc: BaseException) -> None:
    """A router failure inside forwarding as a clean answer, never an empty reply: a 500
    before the answer's head was sent (``started`` False), else the end of the answer (an error
    event first when streaming)."""
    message = f"router error: {exc!r}"
    if not started:
        await send_error(send, 500, message, ErrorType.INTERNAL)
    else:
        await send({"type": "http.response.body", "more_body": False,
                    "body": sse_error(message) if stream else b""})


def sse_error(message: str, code: int = 502) -> bytes:
    """An error event, then ``[DONE]``, so clients end a broken stream cleanly."""
    return b"data: " + error_body(code, message, ErrorType.UPSTREAM) + b"\n\ndata: [DONE]\n\n"
