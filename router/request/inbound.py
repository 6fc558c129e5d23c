"""One inference request as the handler decided it: the value routing and forwarding work on.

The handler builds an :class:`Inbound` once (parsed, keyed, salted, with the router's own engine
request id); the route step, the relays and the bookkeeping read it and never change it.
"""

from __future__ import annotations

import secrets
from typing import Any, NamedTuple

from router.routing.contract import RouteRequest

CLIENT_RID_MAX_CHARS = 256
MAX_BATCH = 4096  # prompts in one batch request


class Inbound(NamedTuple):
    """Everything about one request that outlives its parsing."""

    req: RouteRequest  # what the policy sees; ``req.request_id`` is the engine rid (ours)
    payload: dict[str, Any]  # the client's JSON body, decoded
    raw: bytes  # that body as sent: the router's fields are spliced in, not re-encoded
    salt: str | None  # the cache_salt the router decided (``router/keying/tenants.py``)
    kind: str  # CHAT, COMPLETION or GENERATE (``router/keying/prompt.py``)
    path: str  # the upstream path
    model: str  # the served model (without a LoRA suffix)
    headers: dict[str, str]  # the request headers passed on to workers
    stream: bool
    t0: float  # when the request arrived (router clock)
    client_rid: str | None  # the client's own ``rid``: a label in its records, never sent on
    batch: int | None  # prompts of a batch request (None: one prompt)

    def engine_rids(self, rid: str) -> list[str]:
        """The engine request ids of ``rid``: one, or one per prompt of a batch."""
        return [rid] if self.batch is None else [f"{rid}-{i}" for i in range(self.batch)]

    def engine_fields(self, rid: str, engine: str = "sglang") -> dict[str, Any]:
        """The fields an engine request of this one carries: the router's request id (SGLang's
        ``rid``, a list for a batch; another engine's ``request_id``/``rid`` replaced where the
        client sent one) and the router's salt (a client's own never reaches an engine)."""
        fields: dict[str, Any] = {}
        if engine == "sglang":
            rids = self.engine_rids(rid)
            fields["rid"] = rids if self.batch is not None else rids[0]
        else:
            fields.update({k: rid for k in ("rid", "request_id") if k in self.payload})
        if self.salt is not None or "cache_salt" in self.payload:
            fields["cache_salt"] = self.salt
        return fields


def new_rid() -> str:
    """An engine request id nobody else can guess or claim (aborts and duplicates are keyed by
    it at the engine): 96 random bits, not a counter that a client could predict."""
    return f"rg-{secrets.token_hex(12)}"


class ClientRidError(ValueError):
    """A client ``rid`` the router will not keep even as a label (HTTP 400)."""


def client_rid_label(value: object, batch: int | None) -> str | None:
    """The client's ``rid`` as a label: a printable string of bounded length (a batch's list,
    one per prompt, is labelled by its first item). Anything else is refused, never passed on;
    so is a batch of more than ``MAX_BATCH`` prompts."""
    if batch is not None and batch > MAX_BATCH:
        raise ClientRidError(f"a batch of {batch} prompts is more than {MAX_BATCH}")
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) != (batch or 1):
            raise ClientRidError("'rid' must be one string per prompt of the batch")
        value = value[0]
    if not isinstance(value, str) or not value:
        raise ClientRidError("'rid' must be a non-empty string (or a list of them for a batch)")
    if len(value) > CLIENT_RID_MAX_CHARS or not value.isprintable():
        raise ClientRidError(f"'rid' must be at most {CLIENT_RID_MAX_CHARS} printable characters")
    return value
