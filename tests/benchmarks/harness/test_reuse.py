"""The reuse breakdown (docs/interfaces.md, "The reuse breakdown"): a trie-based ``available``
against a brute-force model, and where tokens were lost."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.harness.reuse import PageTrie, available_tokens, reusable_cap, summarize_reuse
from radix_global_tools.replay.stats import RequestResult


def result(i: int, sent: float, ttft: float | None, prompt: int, status: str = "ok",
           **kw: object) -> RequestResult:
    return RequestResult(i, status, sent, sent, prompt, 1, ttft_s=ttft, **kw)  # type: ignore[arg-type]


def brute_available(prompts: list[list[int]], results: list[RequestResult], page: int
                    ) -> list[int]:
    out = []
    for ids, r in zip(prompts, results, strict=True):
        best = 0
        for q_ids, q in zip(prompts, results, strict=True):
            if q.ttft_s is None or q.sent_s + q.ttft_s > r.sent_s:
                continue
            n = 0
            while n < min(len(ids), len(q_ids)) and ids[n] == q_ids[n]:
                n += 1
            best = max(best, n // page * page)
        out.append(min(best, reusable_cap(len(ids), page)))
    return out


def test_a_turn_reuses_what_finished_before_it_was_sent() -> None:
    sys_prompt = list(range(32))
    prompts = [[*sys_prompt, 100, 101, 102, 103], [*sys_prompt, 200, 201], [*sys_prompt, 300]]
    results = [result(0, 0.0, 1.0, 36), result(1, 0.5, 1.0, 34),  # sent before 0 finished
               result(2, 1.0, 1.0, 33)]  # sent exactly when 0 finished: counts
    assert available_tokens(prompts, results, 16) == [0, 0, 32]


def test_rejected_requests_make_nothing_available_and_the_last_token_is_computed() -> None:
    ids = list(range(48))
    results = [result(0, 0.0, None, 48, status="rejected"), result(1, 1.0, 0.1, 48),
               result(2, 2.0, 0.1, 48)]
    # 1 found nothing (0 was rejected); 2 shares all 48 tokens with 1 but must compute the last
    assert available_tokens([ids, ids, ids], results, 16) == [0, 0, 32]
    # a stream that broke after its first token had finished its prefill
    results[1] = result(1, 1.0, 0.1, 48, status="failed")
    assert available_tokens([ids, ids, ids], results, 16) == [0, 0, 32]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(
    st.lists(st.integers(0, 2), min_size=1, max_size=12), st.floats(0, 5), st.floats(0, 2),
    st.booleans()), min_size=1, max_size=10))
def test_available_matches_brute_force(page: int, reqs: list[tuple[list[int], float, float,
                                                                    bool]]) -> None:
    prompts = [ids for ids, *_ in reqs]
    results = [result(i, sent, ttft, len(ids), "ok" if ok else "failed")
               for i, (ids, sent, ttft, ok) in enumerate(reqs)]
    assert available_tokens(prompts, results, page) == brute_available(prompts, results, page)


def test_trie_matches_whole_pages_only() -> None:
    trie = PageTrie(4)
    trie.add([1, 2, 3, 4, 5, 6])  # the partial last page is not stored
    assert trie.match([1, 2, 3, 4, 5, 6, 7, 8]) == 4
    assert trie.match([9, 2, 3, 4]) == 0
    with pytest.raises(ValueError):
        PageTrie(0)


def test_breakdown_says_where_tokens_were_lost() -> None:
    rs = [result(0, 0.0, 0.1, 100, router_prefix_tokens=0, router_fetch_tokens=0),
          # available 64, router predicted 48 (32 of them from L3), engine delivered 40
          # with 16 from storage: 16 not captured, 8 not delivered, 16 late
          result(1, 1.0, 0.1, 100, router_prefix_tokens=48, router_fetch_tokens=32,
                 cached_tokens=40, pool_tokens_loaded=16, device_cached_tokens=24,
                 host_cached_tokens=0),
          result(2, 1.0, None, 100, status="failed")]
    s = summarize_reuse(rs, [0, 64, 80])
    assert (s["prompt_tokens"], s["available"], s["captured"], s["delivered"]) == (200, 64, 48, 40)
    assert s["late"] == 16 and s["delivered_storage"] == 16
    assert s["delivered_device"] == 24  # request 0 had nothing cached: no split, 0 per tier
    rs[0] = result(0, 0.0, 0.1, 100, cached_tokens=8, router_prefix_tokens=0,
                   router_fetch_tokens=8)  # cached, but no split reported: tiers unknown
    s = summarize_reuse(rs, [0, 64, 80])
    assert s["delivered_device"] is None and s["delivered_storage"] is None
    assert s["late"] == 16  # the request without a split is left out, as the router does
    assert s["lost"] == {"not_available": 136, "not_captured": 16, "not_delivered": 8}
    assert s["available_fraction"] == pytest.approx(0.32)


def test_a_router_that_predicts_nothing_has_no_captured_or_late() -> None:
    rs = [result(0, 0.0, 0.1, 64, cached_tokens=32)]
    s = summarize_reuse(rs, [48])
    assert s["captured"] is None and s["late"] is None and s["captured_fraction"] is None
    assert s["available_router"] is None  # nor the router's own view of what was available
    assert s["lost"] == {"not_available": 16, "not_captured": None, "not_delivered": 16}


def test_the_routers_own_available_is_reported_beside_the_plans() -> None:
    rs = [result(0, 0.0, 0.1, 64, router_prefix_tokens=32, router_available_tokens=48),
          result(1, 0.2, 0.1, 64, router_prefix_tokens=0, router_available_tokens=16)]
    s = summarize_reuse(rs, [48, 32])
    assert (s["available"], s["available_router"]) == (80, 64)
    assert s["available_router_fraction"] == pytest.approx(0.5)


def test_mismatched_lengths_are_an_error() -> None:
    with pytest.raises(ValueError):
        available_tokens([[1]], [], 1)
    with pytest.raises(ValueError):
        summarize_reuse([result(0, 0.0, 0.1, 1)], [])
