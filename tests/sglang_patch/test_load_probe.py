"""The start-up probe of an engine's load path from the pool (sglang_patch/load_probe.py)."""

from __future__ import annotations

import json

import httpx
import pytest

from sglang_patch.load_probe import LoadProbeError, LoadSample, load_rate_Bps, probe_load

URL = "http://engine"


def test_rate_takes_the_remainders_compute_out_of_the_loaded_time() -> None:
    # 1000 tokens computed in 2 s; the second time 900 came from storage in 0.5 s, of which
    # the 100 recomputed took 0.2 s: 900 tokens x 10 bytes in 0.3 s
    sample = LoadSample(prompt_tokens=1000, cold_s=2.0, loaded_s=0.5, storage_tokens=900)
    assert load_rate_Bps(sample, 10) == pytest.approx(9000 / 0.3)


def test_a_load_lost_in_noise_is_priced_fast_but_never_free() -> None:
    sample = LoadSample(prompt_tokens=1000, cold_s=2.0, loaded_s=0.1, storage_tokens=500)
    assert load_rate_Bps(sample, 10) == pytest.approx(5000 / 0.01)  # floor: a tenth of 0.1 s


@pytest.mark.parametrize("sample, kv", [
    (LoadSample(1000, 2.0, 0.5, 0), 10),
    (LoadSample(1000, 0.0, 0.5, 900), 10),
    (LoadSample(1000, 2.0, 0.5, 900), 0),
])
def test_unusable_samples_are_typed_errors(sample: LoadSample, kv: float) -> None:
    with pytest.raises(LoadProbeError):
        load_rate_Bps(sample, kv)


class FakeEngine:
    """An engine whose pool fills ``fills_after`` flushes late (the write-through is behind)
    and that refuses its first ``refusals`` flushes (a write-back under way)."""

    def __init__(self, fills_after: int = 0, refusals: int = 0) -> None:
        self.fills_after, self.refusals = fills_after, refusals
        self.flushes, self.prompts = 0, []  # type: tuple[int, list[list[int]]]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/flush_cache":
            if self.refusals > 0:
                self.refusals -= 1
                return httpx.Response(400, text="Flush cache failed.")
            self.flushes += 1
            return httpx.Response(200, text="ok")
        ids = json.loads(request.content)["input_ids"]
        self.prompts.append(ids)
        if self.flushes == 0:
            return httpx.Response(200, json={"meta_info": {"cached_tokens": 0}})
        storage = len(ids) - 1 if self.flushes > self.fills_after else 0
        details = {"device": 0, "host": 0, "storage": storage}
        return httpx.Response(200, json={"meta_info": {"cached_tokens_details": details}})


def probe(engine: FakeEngine, tokens: int = 64, **kw: float) -> tuple[float, LoadSample]:
    client = httpx.Client(transport=httpx.MockTransport(engine))
    return probe_load(URL, tokens, 10, settle_s=0.0, client=client, **kw)


def test_probe_warms_up_then_sends_one_prompt_twice_around_a_flush() -> None:
    engine = FakeEngine()
    rate, sample = probe(engine)
    assert engine.flushes == 1 and len(engine.prompts) == 3
    warmup, cold, loaded = engine.prompts
    assert cold == loaded and len(cold) == 64 and warmup != cold
    assert sample.storage_tokens == 63 and rate > 0


def test_a_pool_still_being_written_is_retried_then_measured() -> None:
    engine = FakeEngine(fills_after=2)
    _, sample = probe(engine)
    assert engine.flushes == 3 and sample.storage_tokens == 63


def test_a_refused_flush_is_retried_and_only_refusals_are_a_typed_error() -> None:
    engine = FakeEngine(refusals=2)
    _, sample = probe(engine)
    assert engine.flushes == 1 and sample.storage_tokens == 63
    with pytest.raises(LoadProbeError, match="flush_cache answered 400"):
        probe(FakeEngine(refusals=3))


def test_a_pool_that_never_fills_is_a_typed_error() -> None:
    engine = FakeEngine(fills_after=99)
    with pytest.raises(LoadProbeError, match="loaded nothing"):
        probe(engine, attempts=2)
    assert engine.flushes == 2


@pytest.mark.parametrize("handler, match", [
    (lambda r: httpx.Response(500, text="boom"), "answered 500"),
    (lambda r: httpx.Response(200, text="<html>"), "no JSON"),
])
def test_engine_errors_are_typed_errors(handler, match) -> None:
    client = httpx.Client(transport=httpx.MockTransport(handler))
    with pytest.raises(LoadProbeError, match=match):
        probe_load(URL, 64, 10, settle_s=0.0, client=client)


def test_an_unreachable_engine_is_a_typed_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = httpx.Client(transport=httpx.MockTransport(refuse))
    with pytest.raises(LoadProbeError, match="failed"):
        probe_load(URL, 64, 10, settle_s=0.0, client=client)
    with pytest.raises(LoadProbeError, match="at least 2"):
        probe_load(URL, 1, 10, client=client)
