"""What a client reads of a relayed OpenAI stream: the usage chunk only if it asked for it, an
engine's error in the router's shape, whatever the chunking."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from router.transport.errors import openai_error_body
from router.transport.openai_stream import StreamEdit

TOKEN = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,' \
    b'"delta":{"content":"hi"}}],"usage":null}\n\n'
USAGE = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":' \
    b'{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42,' \
    b'"prompt_tokens_details":{"cached_tokens":32}}}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = TOKEN + TOKEN + USAGE + DONE
ENGINE_ERROR = b'{"object":"error","message":"The input (9000 tokens) is longer than the ' \
    b'model\'s context length (2048 tokens).","type":"BadRequestError","param":null,"code":400}'


def relay(stream: bytes, cuts: list[int], drop_usage: bool) -> bytes:
    edit, out, start = StreamEdit(drop_usage), [], 0
    for cut in [*sorted(cuts), len(stream)]:
        out.append(edit.feed(stream[start:cut]))
        start = cut
    return b"".join(out) + edit.flush()


def test_the_usage_chunk_is_dropped_only_when_the_client_did_not_ask_for_it():
    assert relay(STREAM, [], drop_usage=True) == TOKEN + TOKEN + DONE
    assert relay(STREAM, [], drop_usage=False) == STREAM


@given(st.lists(st.integers(0, len(STREAM)), max_size=8), st.booleans())
def test_any_chunking_relays_what_the_whole_stream_does(cuts, drop_usage):
    assert relay(STREAM, cuts, drop_usage) == relay(STREAM, [], drop_usage)


def test_a_usage_field_in_a_token_chunk_is_kept():
    # continuous usage stats: every chunk carries usage, and none is the usage-only chunk
    chunk = TOKEN.replace(b'"usage":null', b'"usage":{"prompt_tokens":40}')
    assert relay(chunk + DONE, [], drop_usage=True) == chunk + DONE


def test_an_engine_error_event_takes_the_routers_shape():
    out = relay(b"data: " + ENGINE_ERROR + b"\n\n" + DONE, [7], drop_usage=False)
    event, done = out.split(b"\n\n")[:2]
    error = json.loads(event[len(b"data: "):])["error"]
    assert error["type"] == "context_length_exceeded" and error["code"] == 400
    assert error["message"].startswith("The input (9000 tokens)") and done == DONE.strip()


def test_a_whole_json_error_answer_to_a_stream_is_rewritten_at_the_end():
    out = relay(ENGINE_ERROR, [10], drop_usage=True)
    assert json.loads(out)["error"]["code"] == 400


def test_engine_errors_take_the_routers_shape_and_other_bodies_are_left():
    body = json.loads(openai_error_body(ENGINE_ERROR, 400) or b"")
    assert body == {"error": {"message": json.loads(ENGINE_ERROR)["message"], "param": None,
                              "type": "context_length_exceeded", "code": 400}}
    missing = b'{"object":"error","message":"The model `x` does not exist.","type":' \
        b'"NotFoundError","param":"model","code":404}'
    assert json.loads(openai_error_body(missing, 404) or b"")["error"] == {
        "message": "The model `x` does not exist.", "type": "model_not_found",
        "param": "model", "code": 404}
    for other in (b'{"error":{"message":"m"}}', b"not json", b"[1]", b'{"object":"error"}'):
        assert openai_error_body(other, 500) is None


def test_sglangs_own_error_event_takes_the_routers_shape():
    # SGLang writes a streamed error as json.dumps({"error": ErrorResponse}): nested, spaced
    event = json.dumps({"error": json.loads(ENGINE_ERROR)}).encode()
    out = relay(b"data: " + event + b"\n\n" + DONE, [], drop_usage=True)
    error = json.loads(out.split(b"\n\n")[0][len(b"data: "):])["error"]
    assert error["type"] == "context_length_exceeded" and set(error) == {
        "message", "type", "param", "code"}


@given(st.lists(st.integers(0, len(STREAM)), max_size=6))
def test_crlf_separated_events_are_edited_as_well(cuts):
    crlf = STREAM.replace(b"\n\n", b"\r\n\r\n")
    assert relay(crlf, cuts, drop_usage=True) == (TOKEN + TOKEN + DONE).replace(b"\n\n",
                                                                                  b"\r\n\r\n")


def test_a_stream_without_event_ends_is_relayed_past_the_bound():
    from router.transport.openai_stream import MAX_PENDING

    edit = StreamEdit(drop_usage=True)
    assert edit.feed(b"x" * 100) == b""
    big = edit.feed(b"y" * MAX_PENDING)
    assert len(big) == MAX_PENDING + 100 and edit.flush() == b""


def test_a_whole_error_answer_takes_the_http_status():
    edit = StreamEdit(drop_usage=False, status=404)
    assert edit.feed(ENGINE_ERROR) == b"" and json.loads(edit.flush())["error"]["code"] == 404


DETAILS = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"sglext":' \
    b'{"cached_tokens_details":{"device":16,"host":0,"storage":16}}}\n\n'


def test_the_details_the_router_asked_for_are_read_not_relayed():
    from router.transport.bodies import last_sse_event

    stream = TOKEN + DETAILS + USAGE + DONE
    edit = StreamEdit(drop_usage=True, drop_details=True)
    assert edit.feed(stream) + edit.flush() == TOKEN + DONE
    edit = StreamEdit(drop_usage=False, drop_details=False)
    assert edit.feed(stream) + edit.flush() == stream  # the client asked for both
    # what the router books: the usage chunk, with the details of the chunk before it
    final = last_sse_event(stream)
    assert final["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    assert final["sglext"]["cached_tokens_details"]["storage"] == 16


def test_other_sglext_fields_stay_and_a_whole_answer_loses_only_the_details():
    from router.transport.openai_stream import without_details

    mixed = DETAILS.replace(b'{"cached_tokens_details"',
                            b'{"routed_experts":"x","cached_tokens_details"')
    out = StreamEdit(drop_usage=False, drop_details=True).feed(mixed)
    assert json.loads(out[len(b"data: "):])["sglext"] == {"routed_experts": "x"}
    whole = {"id": "c", "choices": [{"index": 0}], "usage": {"prompt_tokens": 4},
             "sglext": {"cached_tokens_details": {"device": 4, "host": 0}}}
    assert without_details(whole) == {"id": "c", "choices": [{"index": 0}],
                                      "usage": {"prompt_tokens": 4}}
    assert without_details({"id": "c"}) is None and without_details([1]) is None
