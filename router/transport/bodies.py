"""Request and answer bodies as bytes: the router's fields spliced into a client's JSON request
(:func:`encode_with`), an answer's JSON if it is JSON (:func:`json_or_none`) and the final
event of a streamed answer (:func:`last_sse_event`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec


def encode_with(raw: bytes, fields: dict[str, Any], payload: Mapping[str, Any] | None = None
                ) -> bytes:
    """The JSON object ``raw`` with ``fields`` set. Spliced in front of it, not re-encoded (a
    long ``input_ids`` list is most of a request's bytes), unless ``payload`` (``raw`` decoded,
    given when ``raw`` may hold one of ``fields`` already) has one of them: then ``payload`` is
    encoded whole with ``fields`` in place, so no key appears twice."""
    if payload is not None and any(k in payload for k in fields):
        return msgspec.json.encode({**payload, **fields})
    if not fields:
        return raw
    body = raw.lstrip()
    if body[:1] != b"{":
        raise ValueError("raw must be a JSON object")
    head = msgspec.json.encode(fields)[:-1]  # '{"k":v,...' without the closing brace
    empty = body[1:].lstrip()[:1] == b"}"
    return head + (b"" if empty else b",") + body[1:]


def json_or_none(raw: bytes) -> Any:
    """An engine answer's JSON, or None when it is not JSON (or nested beyond the decoder)."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None


def last_sse_event(tail: bytes) -> Any:
    """The last JSON ``data:`` event of an SSE stream (where usage / meta_info is final), with
    the ``sglext`` of an earlier event when it has none (SGLang sends its cached tokens by tier
    in a chunk of their own before the usage chunk)."""
    last: Any = None
    for line in reversed(tail.split(b"\n")):
        line = line.strip()
        if not line.startswith(b"data:") or line[5:].strip() in (b"[DONE]", b""):
            continue
        if last is None:
            last = json_or_none(line[5:].strip())
            if not isinstance(last, dict) or "sglext" in last:
                return last
        elif b'"sglext"' in line:
            event = json_or_none(line[5:].strip())
            if isinstance(event, dict) and isinstance(event.get("sglext"), dict):
                return {**last, "sglext": event["sglext"]}
    return last
