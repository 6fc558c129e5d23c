"""The Conductor's shortlist (``price_top_k``): with ``k >= #slots`` it decides exactly as pricing
every slot does; with a small ``k`` it still prices every local prefix holder."""

from __future__ import annotations

import random

from radix_global.index import GlobalIndex
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId
from router.routing.contract import RouteRequest, WorkerState
from router.routing.cost import CostConfig, CostModel
from router.routing.driver import PolicyDriver
from router.routing.policies.conductor import ConductorPolicy
from router.routing.prefill_model import PrefillModel

NS = Namespace("m@1")
PS = 16
POOL = PoolId("pool")


def _scenario(seed: int, top_k: int | None, workers: int, requests: int = 60) -> list[tuple]:
    """Route ``requests`` prompts from a few shared prefixes over ``workers`` slots (some in a
    pool, some with learned prefill speeds, queues building up); return every decision."""
    rng = random.Random(seed)
    idx = GlobalIndex()
    idx.register_namespace(NS, PS)
    prefixes = [[PageKey(rng.getrandbits(60)) for _ in range(32)] for _ in range(4)]
    for j, keys in enumerate(prefixes):
        held = rng.randrange(1, 32)
        idx.apply(StorePages(NS, Location(WorkerId(f"w{rng.randrange(workers)}"), 0, Tier.GPU),
                             None, keys[:held]))
        if j % 2 == 0:
            idx.apply(StorePages(NS, Location(POOL, 0, Tier.POOL), None, keys))
    cost = CostModel(CostConfig(kv_bytes_per_token=64 * 1024, default_bandwidth_Bps=rng.choice(
        [1e8, 50e9])), prefill_prior=lambda: PrefillModel.calibrated(0.001, 1e-4, 1e-9))
    driver = PolicyDriver(ConductorPolicy(price_top_k=top_k), cost, idx)
    ws = [WorkerState(WorkerId(f"w{i}"), NS, pool_id=POOL if i % 3 else None,
                      waiting_tokens=rng.choice([None, 0, 2000]))
          for i in range(workers)]
    out = []
    for r in range(requests):
        now = r * 0.01
        keys = prefixes[rng.randrange(len(prefixes))][: rng.randrange(2, 32)]
        d = driver.route(RouteRequest(f"r{r}", NS, len(keys) * PS + 5, keys, PS), ws, now)
        out.append(d)
        if r >= 5 and r % 2:  # some finish, with measured prefills (refits per worker)
            driver.prefill_done(f"r{r - 5}", now, rng.uniform(0.001, 0.2))
            driver.finished(f"r{r - 5}", True, now)
    return out


def test_shortlist_with_k_at_least_the_slot_count_equals_pricing_every_slot() -> None:
    for seed in range(6):
        for workers in (1, 3, 7, 12):
            exhaustive = _scenario(seed, None, workers)
            for k in (workers, workers + 5):
                assert _scenario(seed, k, workers) == exhaustive, (seed, workers, k)


def test_small_k_prices_every_prefix_holder_and_the_shortest_queues() -> None:
    idx = GlobalIndex()
    idx.register_namespace(NS, PS)
    keys = [PageKey(7000 + i) for i in range(32)]
    idx.apply(StorePages(NS, Location(WorkerId("w9"), 0, Tier.GPU), None, keys[:30]))
    driver = PolicyDriver(ConductorPolicy(price_top_k=2), CostModel(), idx)
    ws = [WorkerState(WorkerId(f"w{i}"), NS) for i in range(12)]
    d = driver.route(RouteRequest("r0", NS, 32 * PS, keys, PS), ws, 0.0)
    assert d.worker_id == "w9" and d.prefix_tokens == 30 * PS
    priced = sorted(str(c.worker_id) for c in d.candidates)
    assert len(priced) == 3 and "w9" in priced  # the holder + 2 others, not all 12


def test_small_k_spreads_cold_requests_over_idle_equal_slots_like_pricing_all() -> None:
    def picks(top_k: int | None) -> list[str]:
        driver = PolicyDriver(ConductorPolicy(price_top_k=top_k), CostModel(), None)
        ws = [WorkerState(WorkerId(f"w{i}"), NS) for i in range(12)]
        return [str(driver.route(RouteRequest(f"r{r}", NS, 512, [], PS), ws, 0.0).worker_id)
                for r in range(24)]

    assert picks(2) == picks(None)
    assert len(set(picks(2))) == 12
