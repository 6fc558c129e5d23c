"""The replay over OpenAI ``/v1/completions`` instead of SGLang ``/generate`` (pure, no I/O).

The same prompt text, output length and sampling (greedy, ``ignore_eos``) as the ``/generate``
body, so that the replay and another OpenAI client (``benchmarks/harness/aiperf.py``) can be
compared on one endpoint. An OpenAI stream carries no token count per chunk: each chunk with
text counts as one token (SGLang streams one token a chunk), and the final usage chunk
(``stream_options.include_usage``) sets the count and the cached tokens.
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


def completion_body(text: str, output_tokens: int, temperature: float,
                    model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": text, "max_tokens": output_tokens, "stream": True,
                            "stream_options": {"include_usage": True}, "ignore_eos": True,
                            "temperature": temperature}
    if model:
        body["model"] = model
    return body


def apply_completion_chunk(result: RequestResult, chunk: dict[str, Any], now: float,
                           state: dict[str, float]) -> None:
    """Fold one streamed ``/v1/completions`` chunk into ``result`` (TTFT at the first chunk
    with text, as OpenAI clients time it)."""
    if "error" in chunk:
        err = chunk["error"]
        result.status, result.error = "failed", str(err.get("message", err)
                                                    if isinstance(err, dict) else err)
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
        if isinstance(usage.get("completion_tokens"), int):
            result.output_tokens = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            result.cached_tokens = details["cached_tokens"]
