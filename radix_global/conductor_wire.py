"""Mooncake Conductor's indexer API on the wire: its request bodies, their bounds, and the refusal
every route answers with (``docs/interfaces.md``, "Mooncake Conductor's indexer API").

Bodies use their field names; unknown fields are refused, as our
:class:`~radix_global.registration.WorkerInfo` refuses them. A refusal is :class:`ApiError`: an
HTTP status, a message and a short ``reason``, sent as ``{"error": ..., "reason": ...}``.
No I/O here.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

import msgspec

from radix_global.registration import MAX_ID_CHARS, MAX_URL_CHARS

ADMIN_BODY_MAX_BYTES = 64 * 1024  # /register, /unregister: a few hundred bytes
QUERY_BODY_MAX_BYTES = 16 * 1024 * 1024  # /query: ~2M token ids as JSON
MAX_QUERY_TOKENS = 1 << 21
# as a client cache_salt at the router (docs/interfaces.md,
# "What a client controls, and what the router decides")
MAX_SALT_CHARS = 256

Text = Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
Endpoint = Annotated[str, msgspec.Meta(max_length=MAX_URL_CHARS)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
Body = TypeVar("Body", bound=msgspec.Struct)


class ApiError(Exception):
    """A refused request: HTTP ``status``, a message and a short ``reason``."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


class RegisterBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    endpoint: Endpoint
    type: Text
    modelname: Text
    instance_id: Text
    block_size: int
    dp_rank: int
    replay_endpoint: Endpoint | None = None
    lora_name: Text | None = None
    tenant_id: Text | None = None
    additionalsalt: Text | None = None
    # Ours, optional: what Mooncake's record lacks.
    url: Endpoint | None = None  # the engine's HTTP base URL (default NO_URL)
    topic: Text = ""  # ZMQ topic to subscribe; "" = every topic, as Mooncake's client
    lora_paths: dict[Text, Endpoint] | None = None  # SGLang --lora-paths name -> path


class UnregisterBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    instance_id: Text
    dp_rank: int
    tenant_id: Text | None = None
    type: Text | None = None  # accepted and ignored, as Mooncake does: the key is
    modelname: Text | None = None  # (instance_id, tenant_id, dp_rank)
    lora_name: Text | None = None
    block_size: int | None = None


class QueryBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: Text
    token_ids: list[TokenId]
    block_size: int
    tenant_id: Text | None = None
    instance_id: Text | None = None
    lora_name: Text | None = None
    lora_id: Text | None = None  # deprecated in their API; here SGLang's lora_id (extra key)
    cache_salt: Annotated[str, msgspec.Meta(max_length=MAX_SALT_CHARS)] | None = None


def decode(body: bytes, kind: type[Body]) -> Body:
    """``body`` as a ``kind``; 400 ``invalid`` for bad JSON or a field out of bounds."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"bad request: {exc}", "invalid") from None
    except (msgspec.DecodeError, RecursionError, ValueError) as exc:
        raise ApiError(400, f"malformed JSON: {str(exc)[:200]}", "invalid") from None


def require_printable(body: msgspec.Struct, *names: str) -> None:
    """400 ``invalid`` unless each of the fields ``names`` of ``body`` is None or printable."""
    for name in names:
        value = getattr(body, name)
        if value is not None and not value.isprintable():
            raise ApiError(400, f"{name} must be printable", "invalid")
