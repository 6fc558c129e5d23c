"""What a slot can read from the pool, from one index match (pure): the run each holder it reads
has, the run its store holds over its segments (``docs/interfaces.md``, "Mooncake Store as the L3
pool": "The run a store holds across its segments"), and a shared prefix's canonical run. The
conductor prices each of them."""

from __future__ import annotations

from radix_global.ops import MatchResult, StoreSpan
from radix_global.pool_ids import is_segment, is_store_segment, store_of
from radix_global.types import HolderId, PoolId
from router.routing.contract import RouteRequest, WorkerState


def pool_pages(match: MatchResult | None) -> dict[HolderId, int]:
    """Longest run per holder over its dp ranks; looked up for each candidate's pool."""
    out: dict[HolderId, int] = {}
    if match is not None:
        for (holder, _), m in match.matched.items():
            if m.pool > out.get(holder, 0):
                out[holder] = m.pool
    return out


def store_spans(req: RouteRequest, worker: WorkerState, match: MatchResult | None,
                 longest: int) -> tuple[StoreSpan, ...]:
    """The spans of the run the worker's store holds over its segments, when that run is longer
    than ``longest`` (every single holder's); none for a salted request opening with a shared
    prefix (its pool pages may be another worker's alias keys: priced per holder)."""
    pool_id = worker.pool_id
    if match is None or pool_id is None or not is_segment(pool_id) or req.shared_keys:
        return ()
    spans = match.store_runs.get(store_of(pool_id), ())
    return spans if spans and spans[-1].end_page > longest else ()


def pool_runs(worker: WorkerState, pools: dict[HolderId, int]) -> list[tuple[PoolId, int]]:
    """(holder, pages) of every holder this slot reads that has a run: its pool first, then the
    other segments of its store (``radix_global/pool_ids.py``), then its pool's disk tier. A
    prefix split over segments is :func:`store_spans`'s."""
    pool_id = worker.pool_id
    if pool_id is None:
        return []
    runs = [(pool_id, pools.get(pool_id, 0))]
    if is_segment(pool_id):
        store = store_of(pool_id)
        runs += [(PoolId(h), pages) for h, pages in pools.items()  # another's disk: not readable
                 if h != pool_id and is_store_segment(h) and store_of(h) == store]
    disk = worker.pool_disk_id
    if disk is not None:
        runs.append((disk, pools.get(disk, 0)))
    return [(h, pages) for h, pages in runs if pages > 0]


def with_shared_prefix(worker: WorkerState, runs: list[tuple[PoolId, int]],
                        shared: dict[HolderId, int], shared_len: int
                        ) -> list[tuple[PoolId, int]]:
    """The pool run of a request whose first ``shared_len`` pages are a registered prefix, on a
    worker whose pool resolves aliases: the canonical run of those pages (the only copy the pool
    keeps: a salted alias entry of another worker may be stale), and past them the longest
    salted run (the first holder wins a tie: its own pool is the faster one)."""
    canonical = max(pool_runs(worker, shared), key=lambda r: r[1], default=None)
    salted = max(runs, key=lambda r: r[1], default=None)
    if canonical is None:
        return []
    if canonical[1] < shared_len or salted is None or salted[1] <= canonical[1]:
        return [canonical]
    return [salted]
