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


def test_cached_tiers_from_an_openai_answer_with_sglangs_details():
    from router.keying.prompt import engine_cached_tiers

    usage = {"prompt_tokens": 64, "prompt_tokens_details": {"cached_tokens": 48}}
    split = {"usage": usage, "sglext": {"cached_tokens_details": {"device": 32, "host": 0,
                                                                 "storage": 16}}}
    assert engine_cached_tiers(split) == {"device": 32, "host": 0, "storage": 16}
    assert engine_cached_tiers({"usage": usage}) is None  # cached, not split: unknown
    cold = {"usage": {"prompt_tokens": 64, "prompt_tokens_details": {"cached_tokens": 0}}}
    assert engine_cached_tiers(cold) == {"device": 0, "host": 0, "storage": 0}
    no_l3 = {"usage": usage, "sglext": {"cached_tokens_details": {"device": 48, "host": 0}}}
    assert engine_cached_tiers(no_l3) == {"device": 48, "host": 0, "storage": 0}
