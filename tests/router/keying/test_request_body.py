"""The typed request bodies (router/keying/request_body.py): what the router reads, the bounds
it refuses, and that the client's other fields are left to the raw bytes."""

from __future__ import annotations

import json

import msgspec
import pytest

from radix_global.types import Namespace
from router.keying.request_body import (
    MAX_BATCH,
    BodyError,
    ChatBody,
    CompletionBody,
    GenerateBody,
    RequestKind,
    decode_body,
    decode_object,
)
from router.request.inbound import Inbound
from router.routing.contract import RouteRequest


def _decode(kind: RequestKind, body: object) -> object:
    return decode_body(kind, json.dumps(body).encode())


def test_each_endpoint_reads_its_prompt_batch_and_output_hint():
    g = _decode(RequestKind.GENERATE, {"input_ids": [[1, 2], [3]], "stream": True,
                                       "sampling_params": {"max_new_tokens": 7, "top_p": 0.5}})
    assert isinstance(g, GenerateBody)
    assert (g.batch, g.needs_tokenizer, g.output_tokens_hint, g.stream_requested) == (
        2, False, 7, True)
    g = _decode(RequestKind.GENERATE, {"text": "hi", "sampling_params": [{"max_new_tokens": 3}]})
    assert (g.batch, g.needs_tokenizer, g.output_tokens_hint) == (None, True, 3)
    c = _decode(RequestKind.COMPLETION, {"prompt": ["a", "b"], "max_tokens": 9})
    assert isinstance(c, CompletionBody) and (c.batch, c.needs_tokenizer) == (2, True)
    c = _decode(RequestKind.COMPLETION, {"prompt": [5, 6], "max_tokens": 9,
                                         "max_completion_tokens": 4})
    assert (c.batch, c.needs_tokenizer, c.output_tokens_hint) == (None, False, 4)
    chat = _decode(RequestKind.CHAT, {"messages": [{"role": "user", "content": "x"}],
                                      "chat_template_kwargs": {"enable_thinking": False}})
    assert isinstance(chat, ChatBody) and chat.batch is None and chat.needs_tokenizer
    assert chat.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(("kind", "body", "says"), [
    (RequestKind.GENERATE, {"sampling_params": {}}, "'text'"),
    (RequestKind.GENERATE, {"text": []}, "'text'"),
    (RequestKind.GENERATE, {"input_ids": ["a", "b"]}, "not strings"),
    (RequestKind.GENERATE, {"input_ids": [[1], "b"]}, "all strings or all token-id lists"),
    (RequestKind.COMPLETION, {"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    (RequestKind.GENERATE, {"text": "x", "sampling_params": {"max_new_tokens": -1}},
     "max_new_tokens"),
    (RequestKind.COMPLETION, {}, "prompt"),
    (RequestKind.COMPLETION, {"prompt": []}, "empty"),
    (RequestKind.COMPLETION, {"prompt": ["a", [1]]}, "all strings"),
    (RequestKind.COMPLETION, {"prompt": "x", "max_tokens": "nine"}, "max_tokens"),
    (RequestKind.COMPLETION, {"prompt": "x", "ttft_slo_s": 0}, "ttft_slo_s"),
    (RequestKind.COMPLETION, {"prompt": "x", "ttft_slo_s": True}, "ttft_slo_s"),
    (RequestKind.COMPLETION, {"prompt": "x", "cache_salt": 3}, "cache_salt"),
    (RequestKind.COMPLETION, {"prompt": "x", "cache_salt": "s" * 300}, "cache_salt"),
    (RequestKind.COMPLETION, {"prompt": "x", "model": 3}, "model"),
    (RequestKind.COMPLETION, {"prompt": "x", "rid": ""}, "'rid'"),
    (RequestKind.COMPLETION, {"prompt": "x", "rid": "a\nb"}, "'rid'"),
    (RequestKind.COMPLETION, {"prompt": ["a", "b"], "rid": ["one"]}, "one string per prompt"),
    (RequestKind.COMPLETION, {"prompt": ["a"] * (MAX_BATCH + 1)}, "batch"),
    (RequestKind.CHAT, {"messages": []}, "messages"),
    (RequestKind.CHAT, {"messages": ["hi"]}, "messages"),
    (RequestKind.CHAT, {"messages": [{"content": "no role"}]}, "'role'"),
    (RequestKind.CHAT, [1], "object"),
])
def test_a_body_out_of_bounds_is_refused_naming_the_field(kind, body, says):
    with pytest.raises(BodyError, match=says):
        _decode(kind, body)


def test_values_the_engines_take_laxly_are_taken_too():
    """The engines' pydantic models are lax: 100.0 is an int, "true" a bool. So are these."""
    body = _decode(RequestKind.COMPLETION, {"prompt": "x", "max_tokens": 100.0,
                                            "stream": "true", "ttft_slo_s": "2"})
    assert (body.output_tokens_hint, body.stream_requested, body.ttft_slo_s) == (100, True, 2.0)


def test_a_body_rewritten_whole_is_checked_whole():
    """The typed decode skips what it does not read; a body the router re-encodes is decoded
    whole, and what only that finds (a number out of range) is a 400 too, never a crash."""
    raw = b'{"text": "x", "temperature": 1e400, "rid": "mine"}'
    body = decode_body(RequestKind.GENERATE, raw)  # temperature is not the router's business
    assert body.sets_engine_field
    with pytest.raises(BodyError, match="out of range"):
        decode_object(raw)
    assert decode_object(b'{"a": 1}') == {"a": 1}


def test_malformed_json_is_a_body_error():
    with pytest.raises(BodyError, match="malformed JSON"):
        decode_body(RequestKind.CHAT, b'{"messages": [')
    with pytest.raises(BodyError, match="ttft_slo_s"):  # what a float would read as infinity
        decode_body(RequestKind.COMPLETION, b'{"prompt": "x", "ttft_slo_s": 1e999}')


def test_the_router_knows_which_of_its_own_fields_the_client_sent():
    body = _decode(RequestKind.GENERATE, {"text": "x", "rid": None, "future_field": {"a": 1}})
    assert body.has("rid") and not body.has("cache_salt") and body.sets_engine_field
    with pytest.raises(AttributeError):  # not a field the router may set: it cannot tell
        body.has("future_field")
    assert not _decode(RequestKind.GENERATE, {"text": "x", "model": "m"}).sets_engine_field
    assert body.client_rid is None
    assert _decode(RequestKind.GENERATE, {"text": ["a", "b"], "rid": ["p", "q"]}).client_rid == "p"


def _inbound(raw: bytes) -> Inbound:
    req = RouteRequest("rg-1", Namespace("ns"), 1, [], 16)
    body = decode_body(RequestKind.GENERATE, raw)
    return Inbound(req, body, raw, "salt", RequestKind.GENERATE, "/generate", "m", {}, 0.0,
                   decode_object(raw) if body.sets_engine_field else None)


def test_unknown_fields_reach_the_engine_byte_for_byte():
    raw = b'{"text": "hi", "future_field": {"nested": [1, 2.50]}, "return_logprob": true}'
    sent = _inbound(raw).engine_body({"rid": "rg-1", "cache_salt": "salt"})
    assert sent.endswith(raw[1:])  # spliced in front: the client's bytes as they were
    assert msgspec.json.decode(sent) == {**json.loads(raw), "rid": "rg-1", "cache_salt": "salt"}


def test_a_router_field_the_client_sent_is_replaced_not_doubled():
    raw = b'{"text": "hi", "cache_salt": "mine", "rid": "client", "x": 1}'
    sent = _inbound(raw).engine_body({"rid": "rg-1", "cache_salt": "salt"})
    assert json.loads(sent) == {"text": "hi", "cache_salt": "salt", "rid": "rg-1", "x": 1}
    assert sent.count(b'"rid"') == 1 and sent.count(b'"cache_salt"') == 1


def _chat_inbound(body: dict[str, object]) -> Inbound:
    raw = json.dumps({"messages": [{"role": "user", "content": "hi"}], **body}).encode()
    req = RouteRequest("rg-1", Namespace("ns"), 1, [], 16)
    decoded = decode_body(RequestKind.CHAT, raw)
    return Inbound(req, decoded, raw, None, RequestKind.CHAT, "/v1/chat/completions", "m", {},
                   0.0, decode_object(raw) if decoded.sets_engine_field else None)


@pytest.mark.parametrize(("body", "asked"), [
    ({"stream": True}, {"include_usage": True}),
    ({"stream": True, "stream_options": None}, {"include_usage": True}),
    ({"stream": True, "stream_options": {"continuous_usage_stats": True}},
     {"continuous_usage_stats": True, "include_usage": True}),
    ({"stream": True, "stream_options": {"include_usage": False}}, {"include_usage": True}),
])
def test_a_stream_asks_the_engine_for_usage_the_client_did_not(body, asked):
    inbound = _chat_inbound(body)
    assert inbound.drops_usage
    sent = json.loads(inbound.engine_body(inbound.engine_fields("rg-1")))
    assert sent["stream_options"] == asked and sent["messages"][0]["content"] == "hi"


@pytest.mark.parametrize("body", [
    {}, {"stream": False}, {"stream": True, "stream_options": {"include_usage": True}}])
def test_usage_the_client_asked_for_or_a_whole_answer_is_left_as_sent(body):
    inbound = _chat_inbound(body)
    assert not inbound.drops_usage
    sent = json.loads(inbound.engine_body(inbound.engine_fields("rg-1")))
    assert sent.get("stream_options") == body.get("stream_options")


def test_stream_options_must_be_an_object():
    with pytest.raises(BodyError, match="stream_options"):
        _decode(RequestKind.CHAT, {"messages": [{"role": "user"}], "stream_options": "all"})


def test_sglang_is_asked_for_cached_tokens_by_tier_unless_the_client_asked():
    inbound = _chat_inbound({})
    sent = json.loads(inbound.engine_body(inbound.engine_fields("rg-1", "sglang")))
    assert sent["return_cached_tokens_details"] is True and inbound.drops_details("sglang")
    vllm = json.loads(inbound.engine_body(inbound.engine_fields("rg-1", "vllm")))
    assert "return_cached_tokens_details" not in vllm and not inbound.drops_details("vllm")
    asked = _chat_inbound({"return_cached_tokens_details": True})
    assert not asked.drops_details("sglang")
    kept = json.loads(asked.engine_body(asked.engine_fields("rg-1", "sglang")))
    assert kept["return_cached_tokens_details"] is True
    declined = _chat_inbound({"return_cached_tokens_details": False})
    assert declined.drops_details("sglang")  # asked for on its behalf, and not relayed
    body = json.loads(declined.engine_body(declined.engine_fields("rg-1", "sglang")))
    assert body["return_cached_tokens_details"] is True
