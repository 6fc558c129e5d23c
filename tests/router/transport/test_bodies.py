"""The relay's request body: fields spliced into the client's JSON equal a full re-encode."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.transport.bodies import encode_with

_values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8),
                    st.lists(st.integers(0, 50_000), max_size=20))
_objects = st.dictionaries(st.sampled_from(["model", "rid", "input_ids", "text", "stream",
                                            "cache_salt", "sampling_params", "x"]), _values)
_fields = st.dictionaries(st.sampled_from(["rid", "cache_salt", "routed_dp_rank",
                                           "bootstrap_room"]), _values)


@settings(max_examples=300, deadline=None)
@given(_objects, _fields, st.sampled_from(["json", "msgspec", "spaced"]))
def test_spliced_body_equals_the_re_encoded_one(payload, fields, style):
    raw = {"json": json.dumps(payload).encode(), "msgspec": msgspec.json.encode(payload),
           "spaced": b"  \n" + json.dumps(payload, indent=1).encode()}[style]
    body = encode_with(raw, fields, payload)
    decoded = msgspec.json.decode(body)
    assert decoded == {**payload, **fields}
    keys = [k for k, _ in json.loads(body, object_pairs_hook=list)]
    assert len(keys) == len(set(keys))  # spliced, never one key twice


def test_nothing_to_change_forwards_the_client_bytes():
    raw = b'{"input_ids": [1, 2, 3], "rid": "a"}'
    assert encode_with(raw, {}) is raw
    assert encode_with(b"{}", {"rid": "r"}) == b'{"rid":"r"}'
    assert encode_with(b"{ \n }", {"rid": "r"}) == b'{"rid":"r" \n }'


def test_a_key_the_client_sent_is_re_encoded_not_duplicated():
    raw = b'{"cache_salt": "mine", "input_ids": [1]}'
    body = encode_with(raw, {"cache_salt": "tenant"}, msgspec.json.decode(raw))
    assert body.count(b"cache_salt") == 1 and json.loads(body)["cache_salt"] == "tenant"


def test_raw_that_is_not_an_object_is_refused():
    with pytest.raises(ValueError):
        encode_with(b"[1]", {"rid": "r"})
