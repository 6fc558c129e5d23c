"""Registry and the cache-blind / approximate policies (router/routing/policies/)."""

from __future__ import annotations

import pytest

from radix_global.types import Namespace, PageKey, Role, WorkerId
from router.routing.admission import SloConfig
from router.routing.contract import ClusterView, RouteRequest, WorkerState
from router.routing.cost import CostModel
from router.routing.driver import PolicyDriver
from router.routing.policies import PolicyConfigError, get_policy, policy_names, policy_options
from router.routing.policies.approx_cache import ApproxCachePolicy

NS = Namespace("m@1")


def workers(n: int, **kw: object) -> list[WorkerState]:
    return [WorkerState(WorkerId(f"w{i}"), NS, **kw) for i in range(n)]  # type: ignore[arg-type]


def request(i: int, keys: list[int] | None = None, tokens: int = 256) -> RouteRequest:
    pages = [PageKey(k) for k in (keys or [])]
    return RouteRequest(f"r{i}", NS, tokens, pages, 16)


def test_registry_knows_every_policy_and_refuses_unknown() -> None:
    assert policy_names() == ["random", "round_robin", "least_load", "approx_cache", "conductor"]
    for name in policy_names():
        assert get_policy(name).name == name
    with pytest.raises(PolicyConfigError, match="unknown policy"):
        get_policy("nope")
    with pytest.raises(PolicyConfigError, match="bad option"):
        get_policy("round_robin", speed=3)
    with pytest.raises(PolicyConfigError):
        get_policy("approx_cache", cache_threshold=2.0)


@pytest.mark.parametrize("name", ["random", "round_robin", "least_load", "approx_cache",
                                  "conductor"])
def test_no_eligible_worker_is_a_rejection_not_a_crash(name: str) -> None:
    view = ClusterView(index=None, cost=CostModel())
    ineligible = [
        WorkerState(WorkerId("drain"), NS, accepting=False),
        WorkerState(WorkerId("dec"), NS, role=Role.DECODE),
        WorkerState(WorkerId("other"), Namespace("x@2")),
    ]
    for pool in ([], ineligible):
        d = get_policy(name).choose(request(0), pool, view, 0.0)
        assert not d.accepted and d.reason == "no_workers" and d.worker_id is None


def test_round_robin_cycles_and_rejected_decisions_cost_no_turn() -> None:
    driver = PolicyDriver(get_policy("round_robin"), CostModel())
    ws = workers(3)
    peeked = driver.policy.choose(request(0), ws, driver.view, 0.0)
    chosen = [driver.route(request(i), ws, 0.0).worker_id for i in range(6)]
    assert peeked.worker_id == "w0"  # choose alone did not advance the cursor
    assert chosen == ["w0", "w1", "w2", "w0", "w1", "w2"]


def test_random_is_seeded_and_uses_every_worker() -> None:
    picks = []
    for _ in range(2):
        driver = PolicyDriver(get_policy("random", seed=7), CostModel())
        picks.append([driver.route(request(i), workers(4), 0.0).worker_id for i in range(40)])
    assert picks[0] == picks[1]
    assert set(picks[0]) == {"w0", "w1", "w2", "w3"}


def test_least_load_follows_outstanding_and_engine_reported_load() -> None:
    driver = PolicyDriver(get_policy("least_load"), CostModel())
    ws = workers(3)
    first = [driver.route(request(i), ws, 0.0).worker_id for i in range(3)]
    assert sorted(str(w) for w in first) == ["w0", "w1", "w2"]  # spread while equal
    driver.finished("r1", True, 1.0)  # its worker is now the only lighter one
    assert driver.route(request(9), ws, 1.0).worker_id == first[1]
    # engine-reported load from other routers counts too
    busy = [ws[0]._replace(running=10), ws[1]._replace(waiting=10), ws[2]]
    driver2 = PolicyDriver(get_policy("least_load"), CostModel())
    assert driver2.route(request(0), busy, 0.0).worker_id == "w2"


def test_approx_cache_sends_a_repeated_prefix_to_the_same_worker() -> None:
    driver = PolicyDriver(get_policy("approx_cache"), CostModel())
    ws = workers(3)
    a = driver.route(request(0, [1, 2, 3, 4]), ws, 0.0)
    driver.route(request(1, [9, 8]), ws, 0.0)
    again = driver.route(request(2, [1, 2, 3, 4, 5]), ws, 0.0)
    assert again.worker_id == a.worker_id
    assert again.prefix_tokens == 4 * 16


def test_approx_cache_below_threshold_or_imbalanced_goes_to_least_load() -> None:
    policy = ApproxCachePolicy(cache_threshold=0.5, balance_abs=2, balance_rel=1.5)
    driver = PolicyDriver(policy, CostModel())
    ws = workers(2)
    assert driver.route(request(0, [1, 2]), ws, 0.0).worker_id == "w0"
    # 1 of 4 pages matched (25% < 50%): least load (w1 has 0 outstanding) wins
    assert driver.route(request(1, [1, 7, 8, 9]), ws, 0.0).worker_id == "w1"
    # full match on w0 wins while the load gap stays <= balance_abs ...
    assert [driver.route(request(i, [1, 2]), ws, 0.0).worker_id for i in (2, 3, 4)] == ["w0"] * 3
    loads = [driver.cost.outstanding(w.slot) for w in ws]
    assert loads == [4, 1]
    # ... and once it exceeds it (4 - 1 > 2 and 4 > 1.5 * 1), least load takes over
    assert driver.route(request(5, [1, 2]), ws, 0.0).worker_id == "w1"


def test_approx_cache_memory_is_lru_bounded_and_forgets_removed_workers() -> None:
    policy = ApproxCachePolicy(max_pages_per_slot=4)
    driver = PolicyDriver(policy, CostModel())
    ws = workers(1)
    driver.route(request(0, [1, 2, 3]), ws, 0.0)
    driver.route(request(1, [7, 8, 9]), ws, 0.0)
    slot = ws[0].slot
    assert policy.tracked_pages(slot) == 4
    assert policy.match_pages(slot, [PageKey(7), PageKey(8), PageKey(9)]) == 3
    assert policy.match_pages(slot, [PageKey(1)]) == 1  # root of the old prompt kept, leaves gone
    assert policy.match_pages(slot, [PageKey(1), PageKey(2)]) == 1
    driver.worker_removed(WorkerId("w0"))
    assert policy.tracked_pages(slot) == 0


def test_policy_options_are_typed_and_checked_before_the_policy_is_built() -> None:
    with pytest.raises(PolicyConfigError, match=r"fetch_ratio must be float, got '1.5'"):
        get_policy("conductor", fetch_ratio="1.5")  # was a TypeError deep in the constructor
    with pytest.raises(PolicyConfigError, match="compare_fetch_cost must be bool"):
        get_policy("conductor", compare_fetch_cost=1)
    with pytest.raises(PolicyConfigError, match=r"no option 'cache_treshold'; valid options: "
                                                r"cache_threshold, balance_abs"):
        get_policy("approx_cache", cache_treshold=0.5)
    with pytest.raises(PolicyConfigError, match="valid options: seed"):
        get_policy("random", ttft_slo_s=2.0)
    conductor = get_policy("conductor", fetch_ratio=2, price_top_k=None)
    assert conductor.fetch_ratio == 2.0  # type: ignore[attr-defined]
    assert policy_options("random") == {"seed": int | None}


def test_the_routers_slo_reaches_the_policy_that_admits() -> None:
    slo = SloConfig(ttft_slo_s=1.0)
    assert get_policy("conductor", slo).slo is slo  # type: ignore[attr-defined]
    assert get_policy("round_robin", slo).name == "round_robin"  # takes no SLO: ignored
