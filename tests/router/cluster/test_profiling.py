"""Prefill profiling on worker join (router/cluster/profiling.py) and why the router needs it: a
conversation's next turn must go to the worker holding its prefix when loads are comparable."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix_global.index import GlobalIndex
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId
from router.cluster.profiling import ProfileSample, fit_profile, profile_worker
from router.routing.contract import Decision, RouteRequest, WorkerState
from router.routing.cost import CostModel
from router.routing.driver import PolicyDriver
from router.routing.policies.conductor import ConductorPolicy
from router.routing.prefill_model import PrefillModel

NS = Namespace("m@1")
PS = 16
CONV = [PageKey(5000 + i) for i in range(64)]  # the conversation's second turn: 1,024 tokens
W0, W1 = WorkerId("w0"), WorkerId("w1")
CPU_S_PER_TOKEN = 2.5e-3  # what this repo's tiny model costs on the bench VM's CPU


def cpu_model() -> PrefillModel:
    samples = [ProfileSample(n, p, 0.05 + CPU_S_PER_TOKEN * (n - p))
               for n in (256, 512, 1024) for p in (0, n // 2)]
    return fit_profile(samples)


def driver(model: PrefillModel | None) -> PolicyDriver:
    idx = GlobalIndex()
    idx.register_namespace(NS, PS)
    # w0 served the first turn: it holds the first 48 pages (768 tokens) of this turn.
    idx.apply(StorePages(NS, Location(W0, 0, Tier.GPU), None, CONV[:48]))
    cost = CostModel()
    if model is not None:
        for w in (W0, W1):
            cost.set_prefill_model(w, model, learn_inferred=False)
    return PolicyDriver(ConductorPolicy(), cost, idx)


def busy(d: PolicyDriver, worker: WorkerId, count: int, new_tokens: int, now: float) -> None:
    """``count`` other requests in flight on ``worker``, each with ``new_tokens`` to compute."""
    for i in range(count):
        rid = f"{worker}-bg{i}"
        req = RouteRequest(rid, NS, 1024, [PageKey(90_000 + 100 * i + j) for j in range(64)], PS)
        dec = Decision(rid, "test", accepted=True, worker_id=worker, dp_rank=0,
                       prefix_tokens=1024 - new_tokens)
        d.cost.on_routed(req, dec, now)


def second_turn(d: PolicyDriver, now: float) -> Decision:
    req = RouteRequest("turn2", NS, 1024, CONV, PS)
    return d.route(req, [WorkerState(W0, NS), WorkerState(W1, NS)], now)


def test_fit_recovers_the_measured_per_token_cost() -> None:
    m = cpu_model()
    assert m.predict(1024, 0) == pytest.approx(0.05 + CPU_S_PER_TOKEN * 1024, rel=0.05)
    # the cached prefix saves what its tokens cost (the whole point of routing to the holder)
    saved = m.predict(1024, 0) - m.predict(1024, 768)
    assert saved == pytest.approx(CPU_S_PER_TOKEN * 768, rel=0.1)


# The tiny model's cold curve on one core of the bench VM, with the prefix-extend patch
# (docs/benchmarks.md, engine probe): attention makes 2,048 tokens cost 2.3x what 1,024 do.
FIXED_S, PER_K_S, ATTENTION_S = 0.05, 0.3, 0.2  # attention: seconds per (thousand tokens)^2


def quadratic_s(n: int, p: int) -> float:
    m, c = (n - p) / 1000, p / 1000
    return FIXED_S + PER_K_S * m + ATTENTION_S * m * (c + m / 2)


def test_fit_recovers_the_attention_term_and_extrapolates_to_longer_prompts() -> None:
    samples = [ProfileSample(n, p, quadratic_s(n, p)) for n in (512, 1024, 2048)
               for p in (0, n // 2)]
    model = fit_profile(samples)
    for n, p in [(2521, 0), (3072, 0), (3072, 2048), (1024, 768)]:
        assert model.predict(n, p) == pytest.approx(quadratic_s(n, p), rel=0.02), (n, p)


def test_a_linear_fit_underprices_long_prompts_negative_control() -> None:
    """What the fit was before the attention term was fitted: the same samples, a line through
    them, prices a 3,072-token cold prefill well under what it costs."""
    samples = [ProfileSample(n, 0, quadratic_s(n, 0)) for n in (256, 512, 1024)]
    m = np.array([s.input_tokens / 1000 for s in samples])
    t = np.array([s.seconds for s in samples])
    fixed, per_k = np.polyfit(m, t, 1)[::-1]
    assert fixed + per_k * 3.072 < 0.8 * quadratic_s(3072, 0)
    assert fit_profile(samples).predict(3072, 0) == pytest.approx(quadratic_s(3072, 0), rel=0.02)


@given(st.lists(st.tuples(st.integers(16, 4096), st.floats(0, 1), st.floats(1e-3, 10)),
                min_size=2, max_size=10))
def test_fit_coefficients_are_never_negative(rows: list[tuple[int, float, float]]) -> None:
    samples = [ProfileSample(n, int(n * f), s) for n, f, s in rows]
    assert all(c >= 0 for c in fit_profile(samples).coef)


def test_fit_rejects_too_few_or_invalid_samples() -> None:
    with pytest.raises(ValueError):
        fit_profile([ProfileSample(100, 0, 0.1), ProfileSample(100, 0, float("nan"))])


def test_second_turn_goes_to_the_holder_when_loads_are_comparable() -> None:
    d = driver(cpu_model())
    busy(d, W0, 2, 256, 0.0)  # mostly-cached turns of other conversations
    busy(d, W1, 1, 256, 0.0)
    dec = second_turn(d, 0.0)
    assert dec.worker_id == W0 and dec.prefix_tokens == 768


def test_inferred_fixed_cost_spreads_the_same_turn_away_negative_control() -> None:
    """What the router learned before profiling: FIFO-inferred times of a batching CPU engine
    are seconds whatever the length, so the fit makes each queued request cost seconds and one
    extra request on the holder outweighs its cache. Same load as the test above."""
    d = driver(None)
    feed_inferred_times(d, W1)
    d.cost.set_prefill_model(W0, d.cost.prefill_model(W1))
    busy(d, W0, 2, 256, 200.0)
    busy(d, W1, 1, 256, 200.0)
    dec = second_turn(d, 200.0)
    assert dec.worker_id == W1


def test_a_profiled_model_is_not_refitted_on_inferred_times() -> None:
    d = driver(cpu_model())
    feed_inferred_times(d, W1)
    busy(d, W0, 2, 256, 200.0)
    busy(d, W1, 1, 256, 200.0)
    assert second_turn(d, 200.0).worker_id == W0


def feed_inferred_times(d: PolicyDriver, worker: WorkerId) -> None:
    """Twelve requests of 256-1,024 cold tokens, each first token ~3 s after routing (queueing
    behind decodes, not compute): what the FIFO inference sees on a busy CPU engine."""
    for k in range(12):
        rid, n = f"o{k}", 256 * (1 + k % 4)
        req = RouteRequest(rid, NS, n, [PageKey(70_000 + 100 * k + j) for j in range(n // PS)], PS)
        d.cost.on_routed(req, Decision(rid, "t", accepted=True, worker_id=worker, dp_rank=0,
                                       prefix_tokens=0), 10.0 * k)
        d.cost.on_prefill_done(rid, 10.0 * k + 3.0)
        d.cost.on_finished(rid, 10.0 * k + 3.0)


def test_overloaded_holder_still_loses_to_an_idle_worker() -> None:
    d = driver(cpu_model())
    busy(d, W0, 4, 1024, 0.0)  # four cold 1k prompts ahead: ~10 s of compute
    dec = second_turn(d, 0.0)
    assert dec.worker_id == W1 and dec.prefix_tokens == 0


class FakeEngine:
    """Answers ``/generate`` after 0.2 ms per uncached token; caches every prompt it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []
        self.bodies: list[dict[str, object]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        ids = tuple(body["input_ids"])
        cached = max((len(s) for s in self.seen if ids[: len(s)] == s), default=0)
        self.seen.append(ids)
        await asyncio.sleep(2e-4 * (len(ids) - cached))
        return httpx.Response(200, json={"text": "x", "meta_info": {}})


def test_profile_worker_measures_each_plan_point_with_its_prefix_cached() -> None:
    engine = FakeEngine()

    async def run() -> list[ProfileSample]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
            return await profile_worker(client, "http://w0", PS, max_input_tokens=1024, sizes=3)

    samples = asyncio.run(run())
    assert sorted((s.input_tokens, s.prefix_tokens) for s in samples) == [
        (256, 0), (256, 128), (512, 0), (512, 256), (1024, 0), (1024, 512)]
    assert all(b["sampling_params"]["max_new_tokens"] == 1 for b in engine.bodies)  # type: ignore[index]
    model = fit_profile(samples)
    # timer noise aside, the fit sees ~0.2 ms per computed token and that a prefix saves it
    assert 1e-4 < (model.predict(1024, 0) - model.predict(1024, 512)) / 512 < 4e-4


def test_profile_worker_raises_on_a_failing_worker() -> None:
    async def run() -> None:
        transport = httpx.MockTransport(lambda r: httpx.Response(500, text="boom"))
        async with httpx.AsyncClient(transport=transport) as client:
            await profile_worker(client, "http://w0", PS, max_input_tokens=256, sizes=1)

    with pytest.raises(httpx.HTTPStatusError):
        asyncio.run(run())


def test_router_profiles_a_worker_when_it_joins(upstreams, router_factory):
    """RouterState wiring: the joining worker gets the plan's 1-token generations (over real
    HTTP), and its fitted model replaces the prior; /admin/stats reports it."""
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), profile_max_tokens=64, profile_sizes=2)
    router.wait_workers(1)
    deadline = time.monotonic() + 10
    while router.state.profiler.pending() or not router.state.profiler.outcomes:
        assert time.monotonic() < deadline, router.state.profiler.outcomes
        time.sleep(0.05)
    (wid, outcome), = router.state.profiler.outcomes.items()
    assert outcome["state"] == "done", outcome
    bodies = [b for path, b in peer.requests if path == "/generate"]
    # warm-up, then per size (64, 32 tokens): cold, prefix, prefix + rest
    assert len(bodies) == 1 + 2 * 3
    assert all(b["sampling_params"]["max_new_tokens"] == 1 for b in bodies)
    assert router.state.routing.cost.prefill_model(WorkerId(wid)).coef == pytest.approx(
        outcome["coef"])
    with router.client() as c:
        assert c.get("/admin/stats").json()["profiling_pending"] == 0
