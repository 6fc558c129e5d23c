"""The replay over OpenAI /v1/completions (radix_global_tools/replay/completions.py): the body
and the folding of its stream's chunks."""

from __future__ import annotations

import pytest

from radix_global_tools.replay.completions import apply_completion_chunk, completion_body
from radix_global_tools.replay.stats import RequestResult


def fresh() -> tuple[RequestResult, dict[str, float]]:
    return RequestResult(0, "ok", 0.0, 0.0, 10, 3), {"sent": 1.0, "last": 1.0}


def test_body_matches_the_generate_request() -> None:
    body = completion_body("w1 w2", 3, 0.0, "m")
    assert body == {"prompt": "w1 w2", "max_tokens": 3, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": True,
                    "temperature": 0.0, "model": "m"}
    assert "model" not in completion_body("w1", 1, 0.0, None)


def test_ttft_at_the_first_chunk_with_text_and_usage_sets_the_counts() -> None:
    r, state = fresh()
    apply_completion_chunk(r, {"choices": [{"text": ""}]}, 1.2, state)  # no text: not a token
    assert r.ttft_s is None
    apply_completion_chunk(r, {"choices": [{"text": " w7"}]}, 1.5, state)
    apply_completion_chunk(r, {"choices": [{"text": " w8"}]}, 1.6, state)
    apply_completion_chunk(r, {"choices": [{"text": " w9"}]}, 1.8, state)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.tbt_s == pytest.approx([0.1, 0.2])
    assert r.output_tokens == 3
    apply_completion_chunk(r, {"choices": [], "usage": {
        "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}}, 1.9, state)
    assert (r.output_tokens, r.cached_tokens, r.status) == (3, 8, "ok")


def test_an_error_chunk_fails_the_request() -> None:
    r, state = fresh()
    apply_completion_chunk(r, {"error": {"message": "overloaded"}}, 1.1, state)
    assert (r.status, r.error) == ("failed", "overloaded")


def test_a_merged_chunk_is_one_gap_and_usage_sets_the_count() -> None:
    # SGLang merges the tokens that queued while the client was slow into one chunk.
    r, state = fresh()
    apply_completion_chunk(r, {"choices": [{"text": " w7"}]}, 1.5, state)
    apply_completion_chunk(r, {"choices": [{"text": " w8 w9"}]}, 1.9, state)
    assert (r.output_tokens, r.tbt_s) == (2, pytest.approx([0.4]))
    assert "usage" not in state
    apply_completion_chunk(r, {"choices": [], "usage": {"completion_tokens": 3}}, 2.0, state)
    assert r.output_tokens == 3 and state["usage"] == 1.0
