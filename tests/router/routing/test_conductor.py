"""The Conductor (router/routing/policies/conductor.py) against the real GlobalIndex."""

from __future__ import annotations

from radix_global.index import GlobalIndex
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId
from router.routing.admission import SloConfig
from router.routing.contract import Decision, RouteRequest, WorkerState
from router.routing.cost import CostConfig, CostModel
from router.routing.driver import PolicyDriver
from router.routing.policies.conductor import ConductorPolicy
from router.routing.prefill_model import PrefillModel

NS = Namespace("m@1")
PS = 16
POOL = PoolId("pool")
KEYS = [PageKey(1000 + i) for i in range(64)]  # a 1024-token prompt


def index_with(*stores: tuple[str, int, Tier, int]) -> GlobalIndex:
    """stores: (holder, dp_rank, tier, leading pages of KEYS held)."""
    idx = GlobalIndex()
    idx.register_namespace(NS, PS)
    for holder, rank, tier, pages in stores:
        idx.apply(StorePages(NS, Location(holder, rank, tier), None, KEYS[:pages]))  # type: ignore[arg-type]
    return idx


def driver(idx: GlobalIndex | None, bandwidth: float = 50e9, **policy: object) -> PolicyDriver:
    # ~1 ms per 10 tokens cold, so a 1024-token prefill costs ~0.1 s and a 64 KB/token transfer
    # of 1000 tokens costs 1.3 ms at 50 GB/s (fetching pays) and 6.5 s at 10 MB/s (it does not).
    cost = CostModel(
        CostConfig(kv_bytes_per_token=64 * 1024, default_bandwidth_Bps=bandwidth),
        prefill_prior=lambda: PrefillModel.calibrated(0.001, 1e-4, 1e-9),
    )
    return PolicyDriver(ConductorPolicy(**policy), cost, idx)  # type: ignore[arg-type]


def workers(n: int, pool: PoolId | None = POOL, dp_size: int = 1) -> list[WorkerState]:
    return [WorkerState(WorkerId(f"w{i}"), NS, dp_rank=r, dp_size=dp_size, pool_id=pool)
            for i in range(n) for r in range(dp_size)]


def request(i: int, pages: int = 64, slo: float | None = None) -> RouteRequest:
    return RouteRequest(f"r{i}", NS, pages * PS, KEYS[:pages], PS, ttft_slo_s=slo)


def test_prefers_the_worker_with_the_cached_prefix() -> None:
    d = driver(index_with(("w2", 0, Tier.GPU, 60)))
    dec = d.route(request(0), workers(4), 0.0)
    assert dec.accepted and dec.worker_id == "w2"
    assert dec.prefix_tokens == 60 * PS and dec.fetch_tokens == 0
    by_worker = {str(c.worker_id): c for c in dec.candidates}
    assert by_worker["w2"].ttft_s < by_worker["w0"].ttft_s
    assert by_worker["w0"].local_prefix_tokens == 0  # w2's GPU cache is not w0's


def test_overloaded_cache_holder_loses_to_a_worker_fetching_from_the_pool() -> None:
    d = driver(index_with(("w0", 0, Tier.GPU, 64), (POOL, 0, Tier.POOL, 64)))
    ws = workers(2)
    first = d.route(request(0), ws, 0.0)
    assert first.worker_id == "w0" and first.fetch_tokens == 0
    # pile cold work on w0 so its queue dominates
    for i in range(1, 6):
        d.cost.on_routed(request(100 + i, pages=4), first._replace(
            request_id=f"x{i}", predicted_prefill_s=1.0, fetch_tokens=0), 0.0)
    second = d.route(request(1), ws, 0.0)
    assert second.worker_id == "w1"
    assert second.fetch_from == POOL and second.fetch_tokens == 64 * PS
    assert second.predicted_transfer_s > 0


def test_no_pool_means_another_workers_cache_is_unreachable() -> None:
    d = driver(index_with(("w0", 0, Tier.GPU, 64), (POOL, 0, Tier.POOL, 64)))
    ws = [WorkerState(WorkerId("w1"), NS)]  # no pool_id
    dec = d.route(request(0), ws, 0.0)
    assert dec.worker_id == "w1" and dec.prefix_tokens == 0 and dec.fetch_tokens == 0


def test_fetch_threshold_ratio_and_minimum_length() -> None:
    ws = [WorkerState(WorkerId("w0"), NS, pool_id=POOL)]
    # local 40 pages, pool 48: 48 < 1.5 * 40 -> recompute the 24 missing pages
    d = driver(index_with(("w0", 0, Tier.HOST, 40), (POOL, 0, Tier.POOL, 48)), fetch_ratio=1.5)
    dec = d.route(request(0), ws, 0.0)
    assert dec.fetch_tokens == 0 and dec.prefix_tokens == 40 * PS
    # pool 64 >= 1.5 * 40 -> fetch 24 pages
    d = driver(index_with(("w0", 0, Tier.HOST, 40), (POOL, 0, Tier.POOL, 64)), fetch_ratio=1.5)
    dec = d.route(request(0), ws, 0.0)
    assert dec.fetch_tokens == 24 * PS and dec.prefix_tokens == 64 * PS
    # no local hit: a pool match shorter than min_fetch_pages is not fetched
    d = driver(index_with((POOL, 0, Tier.POOL, 3)), min_fetch_pages=4)
    assert d.route(request(0), ws, 0.0).fetch_tokens == 0
    d = driver(index_with((POOL, 0, Tier.POOL, 4)), min_fetch_pages=4)
    assert d.route(request(0), ws, 0.0).fetch_tokens == 4 * PS


def test_no_fetch_planned_below_the_engines_prefetch_threshold() -> None:
    """SGLang loads no storage hit under its prefetch threshold (registered as
    ``pool_fetch_min_tokens``): a shorter planned fetch was "late" in every case of the
    cache-pressure run, so the router prices it as what happens, a recompute."""
    idx = index_with(("w0", 0, Tier.HOST, 40), (POOL, 0, Tier.POOL, 64))  # 24 pages = 384 tok
    for threshold, fetched in ((256, 24 * PS), (385, 0), (0, 24 * PS)):
        ws = [WorkerState(WorkerId("w0"), NS, pool_id=POOL, pool_fetch_min_tokens=threshold)]
        dec = driver(idx).route(request(0), ws, 0.0)
        assert dec.fetch_tokens == fetched, (threshold, dec)
        assert dec.prefix_tokens == 40 * PS + fetched


def test_no_fetch_planned_while_the_engines_waiting_requests_hold_its_prefetch_budget() -> None:
    """SGLang reserves, for every request it queues, the prompt beyond its local prefix (when
    at least its prefetch threshold, in the pool or not) until it admits it, and declines a
    storage prefetch while those reservations reach half its host tier
    (``pool_prefetch_budget_tokens``): the router plans no fetch past that."""
    prompts = [[PageKey(5000 + 100 * i + j) for j in range(64)] for i in range(4)]
    idx = index_with()
    for keys in prompts:  # 1,024 tokens each, in the pool only
        idx.apply(StorePages(NS, Location(POOL, 0, Tier.POOL), None, keys))

    def ask(i: int) -> RouteRequest:
        return RouteRequest(f"r{i}", NS, 64 * PS, prompts[i], PS)

    short = RouteRequest("short", NS, 8 * PS, [PageKey(9000 + j) for j in range(8)], PS)
    ws = [WorkerState(WorkerId("w0"), NS, pool_id=POOL, pool_fetch_min_tokens=256,
                      pool_prefetch_budget_tokens=2048)]
    d = driver(idx)
    slot = ws[0].slot
    assert d.route(short, ws, 0.0).fetch_tokens == 0
    assert d.cost.prefetch_reserved_tokens(slot, 256) == 0  # 128 tokens: under the threshold
    fetched = [d.route(ask(i), ws, 0.0).fetch_tokens for i in range(3)]
    assert fetched == [64 * PS, 64 * PS, 0]  # the third arrives with 2,048 tokens reserved
    assert d.cost.prefetch_reserved_tokens(slot, 256) == 3 * 64 * PS  # a recompute holds too
    for done in ("r0", "r2"):
        d.prefill_done(done, 1.0)  # admitted: no longer holding
    assert d.cost.prefetch_reserved_tokens(slot, 256) == 64 * PS
    assert d.route(ask(3), ws, 1.0).fetch_tokens == 64 * PS
    d.finished("r1", ok=False, now=1.0)
    assert d.cost.prefetch_reserved_tokens(slot, 256) == 64 * PS  # r3's; r1 is gone
    unbounded = [WorkerState(WorkerId("w0"), NS, pool_id=POOL)]  # 0: no limit known
    d = driver(idx)
    assert [d.route(ask(i), unbounded, 0.0).fetch_tokens for i in range(3)] == [64 * PS] * 3


def test_slow_link_prefers_recomputation_unless_told_to_follow_the_threshold_only() -> None:
    idx_stores = ((POOL, 0, Tier.POOL, 64),)
    ws = [WorkerState(WorkerId("w0"), NS, pool_id=POOL)]
    slow = driver(index_with(*idx_stores), bandwidth=10e6)
    assert slow.route(request(0), ws, 0.0).fetch_tokens == 0
    blind = driver(index_with(*idx_stores), bandwidth=10e6, compare_fetch_cost=False)
    assert blind.route(request(0), ws, 0.0).fetch_tokens == 64 * PS


def test_ttft_slo_rejects_with_retry_after_and_breakdown() -> None:
    d = driver(index_with(), slo=SloConfig(ttft_slo_s=10.0, max_retry_after_s=30.0))
    ws = workers(1)
    dec = d.route(request(0, slo=1e-4), ws, 0.0)  # a request's own SLO wins
    assert not dec.accepted and dec.reason == "ttft_slo"
    assert dec.retry_after_s is not None and 1.0 <= dec.retry_after_s <= 30.0
    assert len(dec.candidates) == 1 and dec.candidates[0].ttft_s > 1e-4
    assert d.in_flight() == 0 and d.cost.outstanding(ws[0].slot) == 0  # nothing recorded
    ok = d.route(request(1), ws, 0.0)  # the default 10 s SLO is met
    assert ok.accepted


def test_data_parallel_ranks_are_separate_candidates() -> None:
    d = driver(index_with(("w0", 1, Tier.GPU, 64)))
    dec = d.route(request(0), workers(1, dp_size=2), 0.0)
    assert (dec.worker_id, dec.dp_rank) == ("w0", 1) and dec.prefix_tokens == 64 * PS
    assert {(c.worker_id, c.dp_rank) for c in dec.candidates} == {("w0", 0), ("w0", 1)}


def test_ties_go_to_the_least_loaded_worker() -> None:
    d = driver(None)
    ws = workers(2)
    assert [d.route(request(i, pages=1), ws, 0.0).worker_id for i in (0, 1)] == ["w0", "w1"]
    for i in (0, 1):
        d.prefill_done(f"r{i}", 0.0, 0.001)  # prefill queues empty again: TTFTs tie
    d.finished("r1", True, 0.0)  # w0 still decodes r0; w1 is idle
    # rotation alone would now pick w0 again; the load tie-break picks w1
    assert d.route(request(2, pages=1), ws, 0.0).worker_id == "w1"


def test_unknown_namespace_in_the_index_routes_cache_blind() -> None:
    idx = GlobalIndex()  # nothing registered
    policy = ConductorPolicy()
    d = PolicyDriver(policy, CostModel(), idx)
    assert d.route(request(0), workers(2), 0.0).accepted
    assert policy.index_errors == 1


def test_a_busy_holder_keeps_the_turn_when_its_peer_shares_its_compute() -> None:
    """Engines on one CPU host run at the same time but not faster together: moving a turn off
    its busy cache holder to a peer sharing the cores saves no queueing, only loses the cache."""

    def second_turn(shared: bool) -> str | None:
        d = driver(index_with(("w0", 0, Tier.GPU, 64)), routed_ttl_s=0)
        if shared:
            for w in ("w0", "w1"):
                d.cost.share_compute(WorkerId(w), "cpu@host")
        ws = workers(2, pool=None)
        first = d.route(request(0), ws, 0.0)
        assert first.worker_id == "w0"
        for i in range(1, 4):  # cold work piled on w0
            d.cost.on_routed(request(100 + i, pages=4), first._replace(
                request_id=f"x{i}", predicted_prefill_s=1.0, fetch_tokens=0), 0.0)
        return d.route(request(1), ws, 0.0).worker_id

    assert second_turn(shared=False) == "w1"  # independent servers: the idle peer wins
    assert second_turn(shared=True) == "w0"


def test_a_worker_reads_every_segment_of_its_store_and_nothing_else() -> None:
    """A Mooncake Store's pages live in the segment of the host that wrote them
    (radix_global/pool_ids.py): a worker on another host of the same store fetches them; a
    worker of another store, or of a pool of its own, does not."""
    seg_a, seg_b = PoolId("mooncake-m-1@10.0.0.2"), PoolId("mooncake-m-1@10.0.0.3")
    d = driver(index_with((seg_a, 0, Tier.POOL, 64)))
    reader = [WorkerState(WorkerId("w1"), NS, pool_id=seg_b)]
    dec = d.route(request(0), reader, 0.0)
    assert dec.fetch_from == seg_a and dec.fetch_tokens == 64 * PS
    for pool in (PoolId("mooncake-other@10.0.0.3"), PoolId("mooncake-m-1")):
        ws = [WorkerState(WorkerId("w1"), NS, pool_id=pool)]
        assert d.route(request(0), ws, 0.0).fetch_tokens == 0, pool
    # one segment's run inside another's: the longer one, whole
    d = driver(index_with((seg_a, 0, Tier.POOL, 40), (seg_b, 0, Tier.POOL, 20)))
    third = [WorkerState(WorkerId("w2"), NS, pool_id=PoolId("mooncake-m-1@10.0.0.4"))]
    dec = d.route(request(0), third, 0.0)
    assert dec.fetch_from == seg_a and dec.fetch_tokens == 40 * PS


def test_a_run_split_over_a_stores_segments_is_fetched_whole() -> None:
    """Each writer puts only the pages the store lacks in its own segment, so turns that ran on
    different workers split a conversation over their segments; the engine loads the store's
    whole run (docs/interfaces.md, "Mooncake Store as the L3 pool": "The run a store holds
    across its segments"). Each piece
    comes from its segment, the reader's own first, and the sender backlog books each."""
    seg_a, seg_b, seg_c = (PoolId(f"mooncake-m-1@10.0.0.{i}:1") for i in (2, 3, 4))
    idx = index_with((seg_a, 0, Tier.POOL, 30))
    idx.apply(StorePages(NS, Location(seg_b, 0, Tier.POOL), KEYS[29], KEYS[30:50]))
    idx.apply(StorePages(NS, Location(seg_c, 0, Tier.POOL), KEYS[49], KEYS[50:60]))
    d = driver(idx, bandwidth=1e9)
    reader = [WorkerState(WorkerId("wc"), NS, pool_id=seg_c)]
    dec = d.route(request(0), reader, 0.0)
    assert dec.fetch_tokens == 60 * PS and dec.available_tokens == 60 * PS
    assert [(p.holder, p.first_page, p.end_page) for p in dec.fetch_pieces] == [
        (seg_a, 0, 30), (seg_b, 30, 50), (seg_c, 50, 60)]
    assert dec.fetch_from == seg_a  # the piece with the most pages
    assert dec.predicted_transfer_s == max(p.transfer_s for p in dec.fetch_pieces)
    assert d.cost.sending.wait_s(seg_a, 0.0) > 0 and d.cost.sending.wait_s(seg_b, 0.0) > 0
    assert d.cost.sending.wait_s(seg_c, 0.0) == 0  # its own segment: no link
    # a reader of another store, and a salted request opening with a shared prefix: per holder
    other = [WorkerState(WorkerId("wx"), NS, pool_id=PoolId("mooncake-other@10.0.0.9:1"))]
    assert d.route(request(1), other, 0.0).fetch_tokens == 0
    salted = request(2)._replace(shared_keys=KEYS[:4])
    assert d.route(salted, reader, 0.0).fetch_tokens == 0  # no alias-aware pool: recompute


def test_readers_spread_over_the_segments_that_hold_a_run() -> None:
    """A hot run held in two segments (a copy): the second reader's fetch is planned from the
    copy, the first's bytes being ahead of it on the original's link (docs/interfaces.md,
    "Where hosts are": a sender's backlog); the negative control (no backlog) sends both to
    one holder."""
    seg_a, seg_b = PoolId("mooncake-m-1@10.0.0.2:1"), PoolId("mooncake-m-1@10.0.0.3:1")

    def sources(backlog: bool) -> list[PoolId | None]:
        d = driver(index_with((seg_a, 0, Tier.POOL, 64), (seg_b, 0, Tier.POOL, 64)),
                   bandwidth=1e9, routed_ttl_s=0)
        if not backlog:
            d.cost.sending.wait_s = lambda segment, now: 0.0  # type: ignore[method-assign]
        readers = [WorkerState(WorkerId(f"r{i}"), NS,
                               pool_id=PoolId(f"mooncake-m-1@10.0.0.{i}:1")) for i in (4, 5)]
        return [d.route(request(i), readers, 0.0).fetch_from for i in range(2)]

    assert sorted(map(str, sources(True))) == sorted([seg_a, seg_b])
    assert len(set(sources(False))) == 1


def test_a_segments_disk_tier_is_read_by_its_own_worker_only() -> None:
    """A disk tier under a Mooncake segment (docs/interfaces.md, "The persistent disk tier under
    the pool") is a folder on the segment's host: its holder id looks like a segment of the
    store (``<segment>+disk``), but only the worker that owns it reads it."""
    seg_a, seg_b = PoolId("mooncake-m-1@10.0.0.2:1"), PoolId("mooncake-m-1@10.0.0.3:1")
    disk_a = PoolId(f"{seg_a}+disk")
    d = driver(index_with((disk_a, 0, Tier.POOL, 64)))
    other = [WorkerState(WorkerId("wb"), NS, pool_id=seg_b)]
    assert d.route(request(0), other, 0.0).fetch_tokens == 0
    own = [WorkerState(WorkerId("wa"), NS, pool_id=seg_a, pool_disk_id=disk_a)]
    dec = d.route(request(1), own, 0.0)
    assert dec.fetch_from == disk_a and dec.fetch_tokens == 64 * PS


def test_a_segment_leaves_the_index_with_its_worker() -> None:
    """A segment dies with the Mooncake client that contributed it: the worker's removal drops
    the segment's pages, and its disk tier's (only that worker reads the folder, and announces
    it again when it is back); a pool of its own (shm) and its disk stay, they live on without
    the worker."""
    from radix_global.registration import WorkerInfo
    from router.cluster.index_link import EmbeddedIndex
    from router.cluster.registry import Source, WorkerEntry

    link = EmbeddedIndex()
    link.index.register_namespace(NS, PS)
    seg, shm = PoolId("mooncake-m-1@10.0.0.2"), PoolId("shm-host")
    for pool in (seg, shm, PoolId(f"{seg}+disk"), PoolId(f"{shm}+disk")):
        link.index.apply(StorePages(NS, Location(pool, 0, Tier.POOL), None, KEYS[:8]))
    for wid, pool in (("wa", seg), ("wb", shm)):
        info = WorkerInfo(worker_id=wid, url="http://10.0.0.2:1", model="m", namespace=NS,
                          page_size=PS, pool_id=pool, pool_disk_id=f"{pool}+disk")
        link.worker_removed(WorkerEntry(info, Source.REGISTERED, 0.0))
    held = link.index.match(NS, KEYS[:8], 0.0).matched
    assert {h for h, _ in held} == {shm, f"{shm}+disk"}


def test_a_shared_prefix_is_priced_by_its_canonical_pool_run_on_aliasing_workers() -> None:
    """docs/interfaces.md, "Shared platform prefixes across isolated tenants": a salted request (its
    own keys SALTED) whose first 40 pages are a registered prefix (canonical keys KEYS[:40] in the
    pool) is predicted to fetch them on a worker whose pool resolves aliases, never on one without;
    a stale salted alias entry of the prefix does not count once the canonical pages are gone; past
    the prefix the tenant's own salted pool pages count only behind a complete canonical run."""
    salted = [PageKey(5000 + i) for i in range(64)]
    idx = GlobalIndex()
    idx.register_namespace(NS, PS)
    idx.apply(StorePages(NS, Location(POOL, 0, Tier.POOL), None, KEYS[:40]))
    req = RouteRequest("r", NS, 64 * PS, salted, PS, shared_keys=KEYS[:40])
    d = driver(idx, routed_ttl_s=0)  # each route on its own, not behind the one before
    plain = WorkerState(WorkerId("w0"), NS, pool_id=POOL)
    aliasing = plain._replace(pool_aliases=True)
    assert d.route(req, [plain], 0.0).fetch_tokens == 0
    dec = d.route(req, [aliasing], 0.0)
    assert dec.fetch_tokens == 40 * PS and dec.fetch_from == POOL
    assert d.route(req._replace(shared_keys=()), [aliasing], 0.0).fetch_tokens == 0

    # The tenant's own pages in the pool behind the prefix (its alias keys, then its turns).
    idx.apply(StorePages(NS, Location(POOL, 0, Tier.POOL), None, salted[:56]))
    assert d.route(req, [aliasing], 0.0).fetch_tokens == 56 * PS
    # A worker without aliases on the same pool: those salted entries may be the aliasing
    # worker's alias keys, which its own backend would miss.
    assert d.route(req, [plain], 0.0).fetch_tokens == 0
    # The canonical pages are evicted; the salted alias entries are stale: only 20 remain.
    from radix_global.ops import RemovePages

    idx.apply(RemovePages(NS, Location(POOL, 0, Tier.POOL), KEYS[20:40]))
    assert d.route(req, [aliasing], 0.0).fetch_tokens == 20 * PS


def test_a_disk_tier_is_read_at_its_own_bandwidth_and_loses_to_recomputing_when_slow() -> None:
    """docs/interfaces.md, "The persistent disk tier under the pool": pages only on the pool's disk
    tier (its own holder) are fetched when the disk is fast, recomputed when it is slow; the memory
    pool wins where it has them."""
    disk = PoolId("pool+disk")
    idx = index_with((disk, 0, Tier.POOL, 64))
    w = WorkerState(WorkerId("w0"), NS, pool_id=POOL, pool_disk_id=disk)
    fast = driver(idx, routed_ttl_s=0)
    fast.cost.set_holder_bandwidth(disk, 50e9)
    dec = fast.route(request(0), [w], 0.0)
    assert dec.fetch_tokens == 64 * PS and dec.fetch_from == disk
    slow = driver(idx, routed_ttl_s=0)
    slow.cost.set_holder_bandwidth(disk, 10e6)  # 64 KB/token: 6.5 s for the prompt
    assert slow.route(request(0), [w], 0.0).fetch_tokens == 0
    assert fast.route(request(0), [w._replace(pool_disk_id=None)], 0.0).fetch_tokens == 0
    idx.apply(StorePages(NS, Location(POOL, 0, Tier.POOL), None, KEYS[:64]))
    assert fast.route(request(0), [w], 0.0).fetch_from == POOL  # a tie: the memory pool


def test_the_cheapest_holder_wins_not_the_longest_run() -> None:
    """Each holder a worker reads is priced at its own bandwidth: a shorter run in the memory
    pool beats a longer one on a slow disk tier, which would lose to recomputing (the longest
    run alone priced: no fetch at all)."""
    disk = PoolId("pool+disk")
    idx = index_with((disk, 0, Tier.POOL, 64), (POOL, 0, Tier.POOL, 40))
    w = WorkerState(WorkerId("w0"), NS, pool_id=POOL, pool_disk_id=disk)
    slow = driver(idx, routed_ttl_s=0)
    slow.cost.set_holder_bandwidth(disk, 10e6)
    dec = slow.route(request(0), [w], 0.0)
    assert dec.fetch_from == POOL and dec.fetch_tokens == 40 * PS
    fast = driver(idx, routed_ttl_s=0)
    fast.cost.set_holder_bandwidth(disk, 50e9)
    dec = fast.route(request(0), [w], 0.0)
    assert dec.fetch_from == disk and dec.fetch_tokens == 64 * PS


def test_a_cache_holder_busy_with_decoding_requests_loses_once_their_drag_is_learned() -> None:
    """w0 holds the prompt and has 10 requests decoding; each has delayed first tokens there by
    0.2 s beyond the prediction. With the drag learned, w1 (idle, fetching the prompt from the
    pool) wins; with it off (``drag_half_life = 0``), w0 looks idle and keeps it."""
    chosen = {}
    for half_life in (64.0, 0.0):
        idx = index_with(("w0", 0, Tier.GPU, 64), (POOL, 0, Tier.POOL, 64))
        cost = CostModel(
            CostConfig(kv_bytes_per_token=64 * 1024, default_bandwidth_Bps=5e9,
                       drag_half_life=half_life),
            prefill_prior=lambda: PrefillModel.calibrated(0.001, 1e-4, 1e-9),
        )
        d = PolicyDriver(ConductorPolicy(), cost, idx)
        ws = workers(2)
        for i in range(10):  # w0's requests, each later by 0.2 s per one before it
            rid = f"r{100 + i}"
            d.cost.on_routed(request(100 + i, pages=4), Decision(
                rid, "conductor", True, WorkerId("w0"), predicted_prefill_s=0.01), float(i))
            d.cost.on_prefill_done(rid, i + 0.01 + 0.2 * i)
        dec = d.route(request(1), ws, 20.0)
        chosen[half_life] = (dec.worker_id, dec.fetch_tokens)
    assert chosen[64.0] == ("w1", 64 * PS)
    assert chosen[0.0] == ("w0", 0)


def test_the_decision_says_how_much_was_available_anywhere() -> None:
    """``Decision.available_tokens``: the longest prefix held anywhere (here a pool run longer
    than the chosen worker's cache), cut to whole pages below the prompt's last token; None
    where the index was not read."""
    idx = index_with(("w0", 0, Tier.GPU, 20), (POOL, 0, Tier.POOL, 64))
    dec = driver(idx).route(request(0), workers(2, pool=None), 0.0)
    assert dec.prefix_tokens == 20 * PS and dec.available_tokens == 63 * PS
    assert driver(idx).route(request(1, pages=30), workers(2), 0.0).available_tokens == 29 * PS
    assert driver(None).route(request(2), workers(2), 0.0).available_tokens is None
    blind = PolicyDriver(ConductorPolicy(), CostModel(), GlobalIndex())
    assert blind.route(request(3), workers(2), 0.0).available_tokens is None  # refused match


def test_one_in_n_would_be_rejections_is_admitted_as_a_probe() -> None:
    """``SloConfig.ttft_probe_every``: a probe is the decision the policy would have made
    without the SLO, marked; the choice is by request id, so pricing it again agrees."""
    def outcomes(every: int) -> list[tuple[bool, bool]]:
        d = driver(index_with(), slo=SloConfig(ttft_slo_s=1e-4, ttft_probe_every=every))
        decisions = [d.route(request(i), workers(1), 0.0) for i in range(400)]
        assert all(x.accepted == x.probe for x in decisions)
        assert all(x.predicted_ttft_s for x in decisions)  # a rejection says what missed
        return [(x.accepted, d.estimate(request(i), workers(1), 0.0).accepted)
                for i, x in enumerate(decisions)]

    assert not any(a for a, _ in outcomes(0))
    probes = outcomes(10)
    assert all(a == again for a, again in probes)
    assert 20 <= sum(a for a, _ in probes) <= 60  # about 40 of 400


def test_a_whole_answer_is_never_a_probe() -> None:
    """Its first token is never seen: admitted late, it would measure nothing."""
    d = driver(index_with(), slo=SloConfig(ttft_slo_s=1e-4, ttft_probe_every=1))
    assert d.route(request(0), workers(1), 0.0).probe
    whole = d.route(request(1)._replace(streams=False), workers(1), 0.0)
    assert not whole.accepted and not whole.probe
