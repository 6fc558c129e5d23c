"""One inference request as the handler decided it: the value routing and forwarding work on.

The handler builds an :class:`Inbound` once (parsed, keyed, salted, with the router's own engine
request id); the route step, the relays and the bookkeeping read it and never change it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from router.keying.request_body import OpenAiBody, RequestBody, RequestKind, decode_object
from router.routing.contract import RouteRequest
from router.transport.bodies import encode_with


class Inbound(NamedTuple):
    """Everything about one request that outlives its parsing."""

    req: RouteRequest  # what the policy sees; ``req.request_id`` is the engine rid (ours)
    body: RequestBody  # the client's body, typed (the fields the router reads)
    raw: bytes  # that body as sent: the router's fields are spliced in, not re-encoded
    salt: str | None  # the cache_salt the router decided (``router/keying/tenants.py``)
    kind: RequestKind
    path: str  # the upstream path
    model: str  # the served model (without a LoRA suffix)
    headers: dict[str, str]  # the request headers passed on to workers
    t0: float  # when the request arrived (router clock)
    # ``raw`` decoded whole, at the edge, when the router may rewrite the body (the client sent
    # a field the router sets, or a PD hand-off may follow); None on the common path
    client_json: dict[str, Any] | None = None

    @property
    def stream(self) -> bool:
        return self.body.stream_requested

    @property
    def batch(self) -> int | None:
        """Prompts of a batch request (None: one prompt)."""
        return self.body.batch

    @property
    def client_rid(self) -> str | None:
        """The client's own ``rid``: a label in its records, never sent on."""
        return self.body.client_rid

    def payload(self) -> dict[str, Any]:
        """The client's whole body as a dict (for the bodies the router rewrites: PD hand-offs).
        Decoded at the edge where one could follow; decoded now otherwise (a decode worker
        joined since), which is the one place a :class:`BodyError` can still surface."""
        return self.client_json if self.client_json is not None else decode_object(self.raw)

    def engine_rids(self, rid: str) -> list[str]:
        """The engine request ids of ``rid``: one, or one per prompt of a batch."""
        return [rid] if self.batch is None else [f"{rid}-{i}" for i in range(self.batch)]

    def engine_fields(self, rid: str, engine: str = "sglang") -> dict[str, Any]:
        """The fields an engine request of this one carries: the router's request id (SGLang's
        ``rid``, a list for a batch; another engine's ``request_id``/``rid`` replaced where the
        client sent one), the router's salt (a client's own never reaches an engine) and, on an
        OpenAI stream, ``stream_options`` asking for the usage chunk; SGLang's OpenAI requests
        also ask for the cached tokens by tier."""
        fields: dict[str, Any] = {}
        if engine == "sglang":
            rids = self.engine_rids(rid)
            fields["rid"] = rids if self.batch is not None else rids[0]
        else:
            fields.update({k: rid for k in ("rid", "request_id") if self.body.has(k)})
        if self.salt is not None or self.body.has("cache_salt"):
            fields["cache_salt"] = self.salt
        options = self._stream_options()
        if options is not None:
            fields["stream_options"] = options
        if self.drops_details(engine):
            fields["return_cached_tokens_details"] = True
        return fields

    def drops_details(self, engine: str) -> bool:
        """An OpenAI request to SGLang whose cached tokens by tier the router asks for and the
        client did not: ``sglext.cached_tokens_details`` is read, not relayed."""
        body = self.body
        return engine == "sglang" and isinstance(body, OpenAiBody) and \
            not body.details_requested

    @property
    def drops_usage(self) -> bool:
        """A stream whose usage chunk the router asked for and the client did not: the
        engine's last chunk is read, not relayed (``router/transport/openai_stream.py``)."""
        return self._stream_options() is not None

    def _stream_options(self) -> dict[str, Any] | None:
        body = self.body
        return body.engine_stream_options() if isinstance(body, OpenAiBody) else None

    def engine_body(self, fields: dict[str, Any]) -> bytes:
        """The client's body with ``fields`` (of ``ENGINE_FIELDS``) set: spliced in front of the
        bytes as sent, or the body re-encoded where the client sent one of them itself."""
        return encode_with(self.raw, fields, self.client_json)

