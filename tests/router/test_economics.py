"""The live funnel of one answered request (``router/economics.py``), from known decisions and
engine answers."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from radix_global.types import WorkerId
from router.economics import UNSPLIT, Economics, reuse_of
from router.routing.contract import Decision


def decision(prefix: int, fetch: int = 0, available: int | None = 96) -> Decision:
    return Decision("r1", "conductor", True, WorkerId("w0"), prefix_tokens=prefix,
                    fetch_tokens=fetch, predicted_ttft_s=0.5, predicted_queue_s=0.2,
                    available_tokens=available)


def prefill_s(prefix: int) -> float:  # 1 ms per computed token of a 128-token prompt
    return (128 - prefix) * 0.001


def generate(cached: int, details: dict[str, int] | None) -> dict[str, object]:
    meta: dict[str, object] = {"prompt_tokens": 128, "cached_tokens": cached}
    if details is not None:
        meta["cached_tokens_details"] = details
    return {"text": "x", "meta_info": meta}


def test_a_generate_answer_splits_delivered_by_tier_and_finds_the_late_tokens():
    answer = generate(80, {"device": 48, "host": 0, "storage": 32})
    r = reuse_of(decision(96, fetch=48), 128, answer, 0.25, prefill_s, 1000)
    assert (r.available, r.captured, r.late) == (96, 96, 16)  # 48 planned, 32 loaded
    assert r.delivered == {"device": 48, "host": 0, "storage": 32}
    assert r.storage_bytes == 32 * 1000  # its storage tokens at 1,000 KV bytes each
    assert r.prefill_saved_s == pytest.approx(0.080)
    assert r.ttft_saved_s == pytest.approx(0.2 + 0.128 - 0.25)


def test_an_openai_answer_gives_the_total_only():
    answer = {"usage": {"prompt_tokens": 128, "prompt_tokens_details": {"cached_tokens": 64}}}
    r = reuse_of(decision(64, fetch=16), 128, answer, None, prefill_s, 1000)
    assert r.delivered == {UNSPLIT: 64} and r.late is None and r.ttft_saved_s is None


def test_a_cold_answer_delivers_nothing_and_an_unreadable_one_is_unknown():
    cold = reuse_of(decision(0, available=0), 128, generate(0, None), 0.3, prefill_s, 1000)
    assert cold.delivered == {"device": 0, "host": 0, "storage": 0} and cold.late == 0
    assert cold.prefill_saved_s == 0
    blind = reuse_of(decision(0, available=None), 128, None, None, prefill_s, 1000)
    assert blind.delivered is None and blind.available is None and blind.prefill_saved_s is None
    odd = generate(10, {"device": -3, "host": 0, "storage": 13})  # a split that does not add up
    assert reuse_of(decision(0), 128, odd, None, prefill_s, 1000).delivered == {UNSPLIT: 10}


def test_the_counters_and_the_per_model_sums_agree():
    registry = CollectorRegistry()
    econ = Economics(registry)
    split = {"device": 48, "host": 0, "storage": 32}
    hit = reuse_of(decision(96, fetch=48), 128, generate(80, split), 0.25, prefill_s, 1000)
    slow = reuse_of(decision(0, available=0), 128, generate(0, None), 0.9, prefill_s, 1000)
    econ.book("tiny", "w0", hit)
    econ.book("tiny", "w1", slow)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"radix_global_{name}", labels)

    assert value("available_prefix_tokens_total", model="tiny", worker="w0") == 96
    assert value("delivered_prefix_tokens_total", model="tiny", worker="w0",
                 tier="storage") == 32
    assert value("late_prefix_tokens_total", model="tiny", worker="w0") == 16
    assert value("storage_loaded_bytes_total", model="tiny", worker="w0") == 32_000
    assert value("ttft_saved_seconds_total", model="tiny", worker="w0") == pytest.approx(0.078)
    assert value("slower_than_cold_requests_total", model="tiny", worker="w1") == 1
    sums = econ.stats()["tiny"]
    assert sums["requests"] == 2 and sums["prompt_tokens"] == 256
    assert (sums["available_tokens"], sums["captured_tokens"], sums["delivered_tokens"],
            sums["late_tokens"], sums["slower_than_cold"]) == (96, 96, 80, 16, 1)
    assert sums["ttft_saved_s"] == pytest.approx(0.078 + (0.2 + 0.128 - 0.9))


def test_tenants_are_summed_apart_up_to_a_cap_and_ranked_by_prompt_tokens(monkeypatch):
    import router.economics as economics

    monkeypatch.setattr(economics, "TENANT_CAP", 3)
    econ = Economics(CollectorRegistry())
    cold = reuse_of(decision(0, available=0), 128, generate(0, None), None, prefill_s, 1000)
    for tenant, n in (("a", 1), ("b", 3), ("c", 2), ("d", 5), ("e", 1)):
        for _ in range(n):
            econ.book("tiny", "w0", cold, tenant)
    top = econ.top_tenants(3)
    assert [(t["tenant"], t["requests"]) for t in top] == [
        ("(other)", 6), ("b", 3), ("c", 2)]  # d and e came after the cap: summed together
    assert sum(t["prompt_tokens"] for t in econ.top_tenants(10)) == 12 * 128
    assert econ.stats()["tiny"]["requests"] == 12
