"""What a client reads of an OpenAI stream the router relays.

``docs/interfaces.md``, "What the cache is worth, live".

The router asks every streamed OpenAI request for its usage chunk (``stream_options.include_usage``)
so that it can book the engine's cached tokens; a client that did not ask for that chunk does not
get it (:class:`StreamEdit` drops it), and an engine's error event reaches the client in the
router's error shape. Events are edited whole: bytes after the last complete event wait for the
next chunk.
"""

from __future__ import annotations

from router.transport.bodies import json_or_none
from router.transport.errors import openai_error_body

_END = b"\n\n"


class StreamEdit:
    """Edits an SSE stream event by event. ``drop_usage``: the client did not ask for the usage
    chunk (``choices`` empty, ``usage`` set), so it is left out."""

    def __init__(self, drop_usage: bool) -> None:
        self.drop_usage = drop_usage
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to relay for ``chunk``: its complete events, edited."""
        data = self._pending + chunk if self._pending else chunk
        cut = data.rfind(_END)
        if cut < 0:
            self._pending = data
            return b""
        done, self._pending = data[:cut + 2], data[cut + 2:]
        if (not self.drop_usage or b'"usage"' not in done) and b'"object":"error"' not in done:
            return done  # the common chunk: nothing to edit, nothing split
        return b"".join(self._edit(e + _END) for e in done[:-2].split(_END))

    def flush(self) -> bytes:
        """What is left at the end of the stream: an event without its blank line, unedited, or
        a whole JSON error answer (an engine refusing a stream answers with one), edited."""
        rest, self._pending = self._pending, b""
        if rest.lstrip()[:1] == b"{":
            return openai_error_body(rest, 0) or rest
        return rest

    def _edit(self, event: bytes) -> bytes:
        data = _data(event)
        if data is None:
            return event
        answer = json_or_none(data)
        if not isinstance(answer, dict):
            return event
        if self.drop_usage and answer.get("choices") == [] and answer.get("usage") is not None:
            return b""
        if answer.get("object") == "error":
            fixed = openai_error_body(data, 0)
            if fixed is not None:
                return b"data: " + fixed + _END
        return event


def _data(event: bytes) -> bytes | None:
    """The payload of a one-line ``data:`` event (None: another kind of event)."""
    lines = event.strip(b"\n").split(b"\n")
    if len(lines) != 1 or not lines[0].startswith(b"data:"):
        return None
    return lines[0][5:].strip()
