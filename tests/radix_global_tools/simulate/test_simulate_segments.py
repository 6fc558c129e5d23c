"""The simulated pool of per-instance segments in fault domains: copy rounds and a failure."""

from __future__ import annotations

import pytest

from radix_global.types import PageKey, WorkerId
from radix_global_tools.simulate.config import Calibration
from radix_global_tools.simulate.engine import NAMESPACE, ClusterSpec, Simulation
from radix_global_tools.simulate.experiments import FIG5_SETUPS, make_cost, make_policy
from radix_global_tools.simulate.segments import FaultDomains, Segments, segment_of
from radix_global_tools.simulate.workload import SimRequest
from router.cluster.copy_planner import CopyConfig

CAL = Calibration()  # a prompt's prefill (< 1 s) ends before the next one comes
PROMPT = [PageKey(i) for i in range(1, 9)]


def run(copies: bool, fail: str | None) -> Simulation:
    """A hot prompt, first computed on p0 (rack r1), asked every 2 s; p1 is in r2. ``fail``
    fails at 21 s; the two requests after it are numbered ``after*``."""
    config = CopyConfig(interval_s=1.0 if copies else 0.0, min_hit_rate=0.01)
    spec = ClusterSpec(2, CAL, 512, True, pool_tokens=512 * 64,
                       fault_domains=FaultDomains(("r1", "r2"), config, fail, 21.0))
    s = Simulation(spec, make_policy(FIG5_SETUPS["global_cache_aware"], CAL, 512),
                   make_cost(CAL))
    trace = [SimRequest(f"r{i}", 2.0 * i, 512 * 8 + 7, 4, tuple(PROMPT)) for i in range(10)]
    trace += [SimRequest(f"after{i}", 22.0 + i, 512 * 8 + 7, 4, tuple(PROMPT)) for i in range(2)]
    s.run(trace)
    return s


@pytest.mark.parametrize("copies", [True, False])
def test_a_hot_prompt_is_fetched_from_its_copy_after_its_domain_fails(copies: bool) -> None:
    s = run(copies, "r1")
    first = next(r for r in s.records if r.request_id == "r0")
    assert first.worker_id == "p0"
    after = [r for r in s.records if r.request_id.startswith("after")]
    assert {r.worker_id for r in after} == {"p1"}
    fetched = after[0].fetched_tokens
    assert s.rounds is not None and WorkerId("p0") in s.rounds.dead
    if copies:  # ordered into p1's segment before the failure, read from there after it
        assert fetched == 512 * 8
        # p0's segment, the original, died with it: the copy is the original now (promoted)
        assert s.rounds.planner.pages() == 0
    else:  # the negative control: p0's segment died with it, the prompt is recomputed
        assert fetched == 0


def test_without_a_failure_the_copy_is_made_once_and_counted() -> None:
    s = run(True, None)
    assert s.rounds is not None and not s.rounds.dead
    assert s.rounds.outcomes["ordered"] == 1  # r1's copy in r2 covers both domains
    assert isinstance(s.shared, Segments)
    assert s.shared.pages()[segment_of(WorkerId("p1"))] >= len(PROMPT)


def test_a_failed_domain_leaves_the_index() -> None:
    s = run(False, "r1")
    match = s.index.match(NAMESPACE, PROMPT, 100.0, hit=False)
    assert {h for h, _ in match.matched} <= {WorkerId("p1"), segment_of(WorkerId("p1"))}


def test_domains_must_name_every_instance() -> None:
    spec = ClusterSpec(2, CAL, 512, True, fault_domains=FaultDomains(("r1",)))
    with pytest.raises(ValueError, match="2 instances, 1 domains"):
        Simulation(spec, make_policy(FIG5_SETUPS["global_cache_aware"], CAL, 512),
                   make_cost(CAL))


@pytest.mark.parametrize("back", [True, False])
def test_copies_rebalance_into_a_domain_that_comes_back(back: bool) -> None:
    """r1 fails at 21 s and comes back, empty, at 23 s: the prompt, held in r2 only, gets a copy
    in r1's returned segment (no request reaches p0 after it: the copy is the round's). The
    control: r1 stays down, and nothing more is ordered."""
    config = CopyConfig(interval_s=1.0, min_hit_rate=0.01)
    spec = ClusterSpec(2, CAL, 512, True, pool_tokens=512 * 64, fault_domains=FaultDomains(
        ("r1", "r2"), config, "r1", 21.0, back_at_s=23.0 if back else None))
    s = Simulation(spec, make_policy(FIG5_SETUPS["global_cache_aware"], CAL, 512),
                   make_cost(CAL))
    trace = [SimRequest(f"r{i}", 2.0 * i, 512 * 8 + 7, 4, tuple(PROMPT)) for i in range(10)]
    trace += [SimRequest("late", 30.0, 512 * 8 + 7, 4, tuple(PROMPT))]
    s.run(trace)
    assert s.rounds is not None and isinstance(s.shared, Segments)
    held = s.index.match(NAMESPACE, PROMPT, 40.0, hit=False).matched.get(
        (segment_of(WorkerId("p0")), 0))
    if back:  # into r2 before the failure, into r1 after it came back
        assert not s.rounds.dead and s.rounds.outcomes["ordered"] == 2
        assert s.shared.pages()[segment_of(WorkerId("p0"))] == len(PROMPT)
        assert held is not None and held.pool == len(PROMPT)
    else:
        assert s.rounds.outcomes["ordered"] == 1 and held is None


def test_a_segment_sends_one_transfer_at_a_time() -> None:
    """Sender congestion: two fetches from one segment at once, the second waits for the first;
    a read of the reader's own segment does not use the link; a priced, untaken fetch books
    nothing."""
    workers = [WorkerId("p0"), WorkerId("p1"), WorkerId("p2")]
    segs = Segments(NAMESPACE, CAL, workers, 512 * 64)
    segs.store(PROMPT, WorkerId("p0"))
    hot = segment_of(WorkerId("p0"))
    one = CAL.fetch_s(512 * 8)
    assert segs.fetch(PROMPT, 0, 8, hot, False, 0.0, WorkerId("p1")) == (8, pytest.approx(one))
    assert segs.fetch(PROMPT, 0, 8, hot, True, 0.0, WorkerId("p1")) == (8, pytest.approx(one))
    # the first transfer is still on the link: the second ends one transfer later
    assert segs.fetch(PROMPT, 0, 8, hot, True, 0.0, WorkerId("p2")) == (8, pytest.approx(2 * one))
    assert segs.fetch(PROMPT, 0, 8, hot, True, 0.0, WorkerId("p0")) == (8, pytest.approx(one))
    # after the link is free again, no wait
    later = 3 * one
    assert segs.fetch(PROMPT, 0, 8, hot, True, later, WorkerId("p1")) == (8, pytest.approx(one))


def test_the_store_keeps_one_copy_of_a_page() -> None:
    """A prompt whose first pages some segment holds is written past them only, into its
    writer's segment under them (SGLang's write-through after the store's exists check): a
    fetched prefix is not copied by its readers, so a hot prefix stays in one segment."""
    workers = [WorkerId("p0"), WorkerId("p1")]
    segs = Segments(NAMESPACE, CAL, workers, 512 * 64)
    segs.store(PROMPT[:6], WorkerId("p0"))
    ops = segs.store(PROMPT, WorkerId("p1"))
    assert segs.pages() == {segment_of(WorkerId("p0")): 6, segment_of(WorkerId("p1")): 2}
    (store,) = ops
    assert store.parent == PROMPT[5] and list(store.keys) == PROMPT[6:]  # type: ignore[attr-defined]
    assert segs.store(PROMPT, WorkerId("p0")) == []  # every page held somewhere
    # a reader loads the whole run from both segments, in parallel: the longer transfer
    segs.add(WorkerId("p2"))
    got, took = segs.fetch(PROMPT, 0, 1, segment_of(WorkerId("p1")), True, 0.0, WorkerId("p2"))
    assert got == 8 and took == pytest.approx(CAL.fetch_s(512 * 6))
    # a failed instance's segment takes its pages: the run ends where they were
    segs.drop(WorkerId("p1"))
    got, _ = segs.fetch(PROMPT, 0, 8, segment_of(WorkerId("p0")), False, 100.0, WorkerId("p2"))
    assert got == 6


def test_a_store_fetch_reads_each_piece_from_the_segment_the_router_planned() -> None:
    """Pages held by two segments (a copy) are read from the one the router's piece names; a
    page no piece covers from ``holder`` when it has it."""
    from router.routing.contract import FetchPiece

    workers = [WorkerId("p0"), WorkerId("p1"), WorkerId("p2")]
    segs = Segments(NAMESPACE, CAL, workers, 512 * 64)
    s0, s1 = segment_of(WorkerId("p0")), segment_of(WorkerId("p1"))
    segs.store(PROMPT, WorkerId("p0"))
    segs.copy(PROMPT, s1)
    pieces = (FetchPiece(s0, 0, 2, 0.0), FetchPiece(s1, 2, 8, 0.0))
    got, took = segs.fetch(PROMPT, 0, 8, s0, True, 0.0, WorkerId("p2"), pieces)
    assert got == 8 and took == pytest.approx(CAL.fetch_s(512 * 6))  # in parallel
    assert segs.sending_until[s0] == pytest.approx(CAL.fetch_s(512 * 2))
    assert segs.sending_until[s1] == pytest.approx(CAL.fetch_s(512 * 6))
