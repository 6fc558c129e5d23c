"""One inference request as the handler decided it: the value routing and forwarding work on.

The handler builds an :class:`Inbound` once (parsed, keyed, salted, with the router's own engine
request id); the route step, the relays and the bookkeeping read it and never change it.
"""

from __future__ import annotations

import secrets
from typing import Any, NamedTuple

from router.routing.contract import RouteRequest

CLIENT_RID_MAX_CHARS = 256


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

    def engine_fields(self, rid: str) -> dict[str, Any]:
        """The fields every engine request of this one carries: the router's rid (a batch gets
        one per item) and the router's salt (a client's own salt never reaches an engine)."""
        given = self.payload.get("rid")
        fields: dict[str, Any] = {
            "rid": [f"{rid}-{i}" for i in range(len(given))] if isinstance(given, list) else rid}
        if self.salt is not None or "cache_salt" in self.payload:
            fields["cache_salt"] = self.salt
        return fields


def new_rid() -> str:
    """An engine request id nobody else can guess or claim (aborts and duplicates are keyed by
    it at the engine): 96 random bits, not a counter that a client could predict."""
    return f"rg-{secrets.token_hex(12)}"


class ClientRidError(ValueError):
    """A client ``rid`` the router will not keep even as a label (HTTP 400)."""


def client_rid_label(value: object) -> str | None:
    """The client's ``rid`` as a label: a printable string of bounded length (a list, for a
    batch, is labelled by its first item). Anything else is refused, never passed on."""
    if value is None:
        return None
    if isinstance(value, list):
        if not value:
            return None
        value = value[0]
    if not isinstance(value, str) or not value:
        raise ClientRidError("'rid' must be a non-empty string (or a list of them for a batch)")
    if len(value) > CLIENT_RID_MAX_CHARS or not value.isprintable():
        raise ClientRidError(f"'rid' must be at most {CLIENT_RID_MAX_CHARS} printable characters")
    return value
