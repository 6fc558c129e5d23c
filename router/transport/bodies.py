"""Request and answer bodies as bytes: the router's fields spliced into a client's JSON request
(:func:`encode_with`), an answer's JSON if it is JSON (:func:`json_or_none`) and the final
event of a streamed answer (:func:`last_sse_event`)."""

from __future__ import annotations

from typing import Any

import msgspec


def encode_with(payload: dict[str, Any], fields: dict[str, Any], raw: bytes | None = None
                ) -> bytes:
    """``payload`` with ``fields`` set, as JSON. Given ``raw`` (``payload`` as the client sent
    it), fields the payload lacks are spliced in front of it instead of re-encoding the whole
    request: a long ``input_ids`` list is most of a request's bytes."""
    fields = {k: v for k, v in fields.items() if k not in payload or payload[k] != v}
    if raw is None or any(k in payload for k in fields):
        return msgspec.json.encode({**payload, **fields})
    if not fields:
        return raw
    body = raw.lstrip()
    if body[:1] != b"{":
        raise ValueError("raw must be the JSON object payload was decoded from")
    head = msgspec.json.encode(fields)[:-1]  # '{"k":v,...' without the closing brace
    return head + (b"," if payload else b"") + body[1:]


def json_or_none(raw: bytes) -> Any:
    """An engine answer's JSON, or None when it is not JSON (or nested beyond the decoder)."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None


def last_sse_event(tail: bytes) -> Any:
    """The last JSON ``data:`` event of an SSE stream (where usage / meta_info is final)."""
    for line in reversed(tail.split(b"\n")):
        line = line.strip()
        if line.startswith(b"data:") and line[5:].strip() not in (b"[DONE]", b""):
            return json_or_none(line[5:].strip())
    return None
