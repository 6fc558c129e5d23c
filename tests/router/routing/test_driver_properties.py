"""PolicyDriver bookkeeping under random life cycles (hypothesis): nothing leaks, queues stay
non-negative, every policy survives the same event sequences."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radix_global.types import Namespace, PageKey, Role, WorkerId
from router.routing.contract import RouteRequest, WorkerState
from router.routing.cost import CostModel
from router.routing.driver import PolicyDriver
from router.routing.policies import get_policy, policy_names

NS = Namespace("m@1")
WORKERS = [
    WorkerState(WorkerId("p0"), NS, role=Role.PREFILL),
    WorkerState(WorkerId("m0"), NS, dp_size=2, dp_rank=0),
    WorkerState(WorkerId("m0"), NS, dp_size=2, dp_rank=1),
    WorkerState(WorkerId("d0"), NS, role=Role.DECODE, kv_headroom_tokens=50_000),
]
# (kind, request number, prompt tokens): 0 route, 1 prefill done, 2 finished ok, 3 failed
events = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 15), st.integers(1, 4000)),
                  max_size=60)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(policy_names()), script=events)
def test_random_life_cycles_leave_no_state_behind(name: str, script: list) -> None:
    driver = PolicyDriver(get_policy(name), CostModel())
    now = 0.0
    for kind, i, tokens in script:
        now += 0.25
        rid = f"r{i}"
        if kind == 0:
            keys = [PageKey(k) for k in range(tokens // 16)]
            d = driver.route(RouteRequest(rid, NS, tokens, keys, 16), WORKERS, now)
            assert d.accepted or d.reason
            if d.accepted:
                assert d.worker_id in {"p0", "m0"} and (d.worker_id != "p0" or d.decode_worker_id)
        elif kind == 1:
            driver.prefill_done(rid, now)
        else:
            driver.finished(rid, kind == 2, now)
        for w in WORKERS:
            assert driver.cost.queue_s(w, now) >= 0.0
    # a finished request with a reused id must not leave a phantom behind
    outstanding = sum(driver.cost.outstanding(w.slot) for w in WORKERS)
    assert outstanding == driver.in_flight()
    for i in range(16):
        driver.finished(f"r{i}", True, now + 1)
    assert driver.in_flight() == 0
    assert all(driver.cost.outstanding(w.slot) == 0 for w in WORKERS)
    assert driver.decode.reserved_tokens((WorkerId("d0"), 0)) == 0
