"""The replay over OpenAI ``/v1/completions`` instead of SGLang ``/generate`` (pure, no I/O).

The same prompt text, output length and sampling (greedy, ``ignore_eos``) as the ``/generate``
body, so that the replay and another OpenAI client (``benchmarks/harness/aiperf.py``) can be
compared on one endpoint. An OpenAI stream carries no token count per chunk: SGLang sends one
token a chunk but merges what queued up while the client was slow, so on this path TTFT is
exact and ``tbt_s`` holds one gap per chunk (a merged chunk is one longer gap, not several
short ones); the final usage chunk (``stream_options.include_usage``) sets the output and cached
token counts, and a stream that ends without one is a failed request (:data:`NO_USAGE`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from radix_global_tools.replay.stats import RequestResult


class Endpoint(StrEnum):
    """Which engine API the replay sends to."""

    GENERATE = "generate"  # SGLang /generate
    COMPLETIONS = "completions"  # OpenAI /v1/completions


PATHS = {Endpoint.GENERATE: "/generate", Endpoint.COMPLETIONS: "/v1/completions"}
NO_USAGE = "stream ended without a usage chunk (stream_options.include_usage not honoured)"


def error_message(chunk: dict[str, Any]) -> str | None:
    """The error a streamed chunk of either endpoint carries (``{"error": ...}``), else None."""
    if "error" not in chunk:
        return None
    err = chunk["error"]
    return str(err.get("message", err) if isinstance(err, dict) else err)


def completion_body(text: str, output_tokens: int, temperature: float,
                    model: str | None) -> dict[str, Any]:
    """The streamed ``/v1/completions`` body of one planned request: exactly ``output_tokens``
    tokens (``ignore_eos``), a final usage chunk, and ``model`` when given."""
    body: dict[str, Any] = {"prompt": text, "max_tokens": output_tokens, "stream": True,
                            "stream_options": {"include_usage": True}, "ignore_eos": True,
                            "temperature": temperature}
    if model:
        body["model"] = model
    return body


def apply_completion_chunk(result: RequestResult, chunk: dict[str, Any], now: float,
                           state: dict[str, float]) -> None:
    """Fold one streamed ``/v1/completions`` chunk into ``result`` (TTFT at the first chunk
    with text, as OpenAI clients time it); a usage chunk sets ``state["usage"]``."""
    error = error_message(chunk)
    if error is not None:
        result.status, result.error = "failed", error
        return
    choices = chunk.get("choices") or []
    if choices and isinstance(choices[0], dict) and choices[0].get("text"):
        if result.ttft_s is None:
            result.ttft_s = now - state["sent"]
        else:
            result.tbt_s.append(now - state["last"])
        state["last"] = now
        result.output_tokens += 1
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        state["usage"] = 1.0
        if isinstance(usage.get("completion_tokens"), int):
            result.output_tokens = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            result.cached_tokens = details["cached_tokens"]
