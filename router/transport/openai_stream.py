"""What a client reads of an OpenAI stream the router relays.

``docs/interfaces.md``, "What the cache is worth, live". The router asks every streamed OpenAI
request for its usage chunk (``stream_options.include_usage``) so that it can book the engine's
cached tokens; a client that did not ask for that chunk does not get it (:class:`StreamEdit` drops
it), and an engine's error event reaches the client in the router's error shape. Events are
edited whole: bytes after the last complete event wait for the next chunk, up to
:data:`MAX_PENDING` (an event that long is no usage chunk: relayed unedited).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from router.transport.bodies import json_or_none
from router.transport.errors import engine_error, openai_error_body

MAX_PENDING = 1 << 20
_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")  # an SSE event ends at a blank line


def without_details(answer: Any) -> dict[str, Any] | None:
    """``answer`` without SGLang's ``sglext.cached_tokens_details`` (and without ``sglext`` when
    that was all of it), or None when it has none: the router asked for them, not the client."""
    if not isinstance(answer, dict):
        return None
    ext = answer.get("sglext")
    if not isinstance(ext, dict) or "cached_tokens_details" not in ext:
        return None
    rest = {k: v for k, v in ext.items() if k != "cached_tokens_details" and v is not None}
    out = {k: v for k, v in answer.items() if k != "sglext"}
    if rest:
        out["sglext"] = rest
    return out


class StreamEdit:
    """Edits an SSE stream event by event. ``drop_usage``: the client did not ask for the usage
    chunk (``choices`` empty, ``usage`` set), so it is left out; ``drop_details``: nor for
    SGLang's cached tokens by tier (:func:`without_details`; the chunk that carried only them is
    left out); ``status``: the answer's HTTP status, the code of an error rewritten in the
    router's shape."""

    def __init__(self, drop_usage: bool, status: int = 200, drop_details: bool = False) -> None:
        self.drop_usage, self.status, self.drop_details = drop_usage, status, drop_details
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to relay for ``chunk``: its complete events, edited."""
        data = self._pending + chunk if self._pending else chunk
        ends = list(_END.finditer(data))
        if not ends:
            if len(data) > MAX_PENDING:
                self._pending = b""
                return data
            self._pending = data
            return b""
        cut = ends[-1].end()
        done, self._pending = data[:cut], data[cut:]
        if (not self.drop_usage or b'"usage"' not in done) and b'"error"' not in done and \
                (not self.drop_details or b'"sglext"' not in done):
            return done  # the common chunk: nothing to edit, nothing split
        out, start = [], 0
        for end in ends:
            out.append(self._edit(done[start:end.start()], done[end.start():end.end()]))
            start = end.end()
        return b"".join(out)

    def flush(self) -> bytes:
        """What is left at the end of the stream: an event without its blank line, unedited, or
        a whole JSON error answer (an engine refusing a stream answers with one), edited."""
        rest, self._pending = self._pending, b""
        if rest.lstrip()[:1] == b"{":
            return openai_error_body(rest, self.status if self.status >= 400 else 0) or rest
        return rest

    def _edit(self, event: bytes, end: bytes) -> bytes:
        data = _data(event)
        answer = json_or_none(data) if data is not None else None
        if not isinstance(answer, dict):
            return event + end
        if self.drop_usage and answer.get("choices") == [] and answer.get("usage") is not None:
            return b""
        stripped = without_details(answer) if self.drop_details else None
        if stripped is not None:
            if stripped.get("choices") == [] and stripped.get("usage") is None \
                    and "sglext" not in stripped:
                return b""  # the chunk carried the details only
            return b"data: " + msgspec.json.encode(stripped) + end
        fixed = engine_error(answer, self.status if self.status >= 400 else 0)
        return b"data: " + fixed + end if fixed is not None else event + end


def _data(event: bytes) -> bytes | None:
    """The payload of a one-line ``data:`` event (None: another kind of event)."""
    lines = event.splitlines()
    if len(lines) != 1 or not lines[0].startswith(b"data:"):
        return None
    return lines[0][5:].strip()
