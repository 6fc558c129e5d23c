"""What the router reads back from an engine answer (router/keying/prompt.py)."""

from __future__ import annotations


def test_engine_storage_tokens_from_sglang_meta_info():
    from router.keying.prompt import engine_storage_tokens

    meta = {"meta_info": {"cached_tokens": 400, "cached_tokens_details": {"storage": 384}}}
    assert engine_storage_tokens(meta) == 384
    assert engine_storage_tokens([meta]) == 384  # a batch: its first prompt
    # nothing cached at all: SGLang sends no details (a planned fetch that did not happen)
    assert engine_storage_tokens({"meta_info": {"cached_tokens": 0}}) == 0
    for answer in ({"meta_info": {"cached_tokens": 3}}, {"usage": {}}, None, [],
                   {"meta_info": {"cached_tokens_details": {"storage": True}}}):
        assert engine_storage_tokens(answer) is None, answer
