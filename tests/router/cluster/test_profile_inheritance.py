"""A worker joining while its peers are profiled is priced with their fitted prefill curve until
its own profile is fitted (router/cluster/profile_book.py ``ProfileBook``, used by
router/cluster/profiling.py ``Profiler``).

Decision difference with the real conductor: a request whose prefix a profiled CPU worker holds
goes there, not to the newcomer, whose default GPU-like prior would price a cold prefill below
the holder's cached one."""

from __future__ import annotations

import pytest

from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId
from router.cluster.profile_book import ProfileBook, inherited_model
from router.cluster.profiling import ProfileSample, fit_profile
from router.cluster.registry import Source
from router.cluster.slots import worker_states
from router.config import RouterConfig
from router.routing.contract import RouteRequest
from router.routing.prefill_model import PrefillModel
from router.state import RouterState

NS = "tiny@1"
PS = 16
PROMPT = [PageKey(7000 + i) for i in range(96)]  # 1,536 tokens
HELD = 88  # pages of PROMPT the profiled worker caches: 1,408 tokens


def cpu_model(per_token_s: float = 1e-3) -> PrefillModel:
    return fit_profile([ProfileSample(n, p, 0.02 + per_token_s * (n - p))
                        for n in (512, 1024, 2048) for p in (0, n // 2)])


def info(wid: str, namespace: str = NS, model: str = "tiny") -> WorkerInfo:
    return WorkerInfo(worker_id=wid, url=f"http://127.0.0.1:1/{wid}", model=model,
                      namespace=namespace, page_size=PS)


def state_with_profiled_holder() -> RouterState:
    state = RouterState(RouterConfig.from_options(policy="conductor"))
    a = state.registry.add(info("a"), Source.REGISTERED, 0.0)
    state.profiler.apply(a, cpu_model())
    state.index.index.apply(StorePages(Namespace(NS), Location(WorkerId("a"), 0, Tier.GPU), None,
                                       PROMPT[:HELD]))
    return state


def route(state: RouterState) -> str | None:
    req = RouteRequest("r1", Namespace(NS), len(PROMPT) * PS, PROMPT, PS)
    decision = state.routing.route(req, worker_states(state.registry.all()), 1.0)
    assert decision.accepted
    return decision.worker_id


def test_joining_worker_inherits_the_profiled_peer_curve_and_the_decision_follows():
    state = state_with_profiled_holder()
    state.registry.add(info("b"), Source.REGISTERED, 0.0)  # profile pending (no loop runs it)
    cost = state.routing.cost
    assert cost.prefill_s(WorkerId("b"), 1536, 0) == pytest.approx(
        cost.prefill_s(WorkerId("a"), 1536, 0), rel=1e-6)
    assert route(state) == "a"  # the cached prefix wins: 0.15 s vs 1.5 s cold on b


def test_negative_control_default_prior_sends_the_request_to_the_newcomer():
    """What happened before: b on the GPU-like prior looks 20x faster cold than a with its
    cache, so the request leaves its prefix."""
    state = state_with_profiled_holder()
    state.registry.add(info("b"), Source.REGISTERED, 0.0)
    state.routing.cost.set_prefill_model(WorkerId("b"), PrefillModel())
    assert route(state) == "b"


def test_own_profile_replaces_the_inherited_one_and_peers_without_one_follow():
    state = RouterState(RouterConfig.from_options(policy="conductor"))
    a = state.registry.add(info("a"), Source.REGISTERED, 0.0)
    b = state.registry.add(info("b"), Source.REGISTERED, 0.0)
    cost = state.routing.cost
    prior = PrefillModel().predict(1536, 0)
    assert cost.prefill_s(WorkerId("b"), 1536, 0) == pytest.approx(prior)  # nobody profiled
    state.profiler.apply(a, cpu_model(1e-3))  # b, still pending, follows a at once
    assert cost.prefill_s(WorkerId("b"), 1536, 0) == pytest.approx(
        cost.prefill_s(WorkerId("a"), 1536, 0), rel=1e-6)
    state.profiler.apply(b, cpu_model(3e-3))  # b's own curve wins; a keeps its own
    assert cost.prefill_s(WorkerId("b"), 1536, 0) > 2.5 * cost.prefill_s(WorkerId("a"), 1536, 0)
    c = state.registry.add(info("c"), Source.REGISTERED, 0.0)  # mean of the two fitted peers
    mean = (cost.prefill_s(WorkerId("a"), 1536, 0) + cost.prefill_s(WorkerId("b"), 1536, 0)) / 2
    assert cost.prefill_s(c.worker_id, 1536, 0) == pytest.approx(mean, rel=0.02)


def test_other_namespace_and_departed_peers_are_not_inherited():
    book = ProfileBook()
    assert book.joined("a", NS) is None
    assert book.fitted("a", cpu_model()) == {}
    assert book.joined("x", "other@1") is None  # another model: nothing to inherit
    assert book.joined("b", NS) is not None
    book.left("a")
    assert book.joined("c", NS) is None
    assert book.fitted("ghost", cpu_model()) == {}  # unknown worker: ignored


def test_inherited_model_is_a_copy():
    peer = cpu_model()
    heir = inherited_model([peer])
    heir.observe(1024, 0, 99.0)
    for _ in range(10):
        heir.observe(1024, 0, 99.0)
    assert peer.predict(1024, 0) < 2.0 < heir.predict(1024, 0)
    with pytest.raises(ValueError):
        inherited_model([])
