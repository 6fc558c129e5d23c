"""``conductor``: Mooncake's KV-cache-centric scheduling (FAST'25, Algorithm 1; DESIGN.md).

For each candidate prefill slot ``c`` (one per worker and data-parallel rank):

- local hit: the longest prefix ``c`` itself holds on GPU or host (``HolderMatch.host`` of
  ``(c.worker_id, c.dp_rank)``); another worker's GPU/host cache is NOT reachable by ``c``. A
  prompt this router sent to ``c`` in the last ``routed_ttl_s`` seconds, and until
  ``routed_settle_s`` after that request finished, counts as held too
  (:mod:`router.routing.routed_prefixes`): ``c`` has it once that prefill is done, and the queue
  model already puts the new request behind it, while KV events arrive only after the batch;
  after that the index knows better (an engine under cache pressure evicts it within seconds);
- fetchable: the prefix held by each L3 holder ``c`` reads (``c.pool_id``, the other segments
  of its store, its disk tier ``c.pool_disk_id``), each run priced at its holder's bandwidth,
  and the run the store holds over all its segments, each piece from its segment
  (``router/routing/pool_runs.py``, ``store_fetch.py``); the cheapest fetch kept; for a salted
  request that starts with a registered platform prefix, on a worker whose pool resolves
  aliases, the pool run of those pages is their canonical one (``docs/interfaces.md``, "Shared
  platform prefixes across isolated tenants"), its longest run only;
- fetch the difference when the fetchable run exceeds the local one by ``fetch_ratio`` (with no
  local hit: when it is at least ``min_fetch_pages`` long), and, with ``compare_fetch_cost``, only
  when fetching is predicted faster than recomputing (slow links lose to recomputation);
- ``TTFT = queue + transfer + prefill(n, prefix)`` from the cost model.

The slot with the smallest TTFT wins; TTFTs within ``tie_s`` (or ``tie_rel`` of the best) are
ties, broken by the least outstanding requests, then in rotation. If even the best TTFT exceeds
the request's TTFT SLO the request is rejected (``"ttft_slo"``) with a Retry-After estimated from
the excess work that must drain. Every decision carries the per-candidate breakdown of the
slots it priced.

Pricing every slot costs tens of microseconds each, linear in the cluster size, so with more than
``price_top_k`` candidates only those that can win are priced: every slot holding a local prefix
match, plus the ``price_top_k`` others with the shortest predicted queue (then fewest outstanding).
Slots without a local match differ only in queue, load and per-worker prefill/transfer speed, so
the shortest queues are where their best one is. With ``price_top_k >= len(candidates)`` (or
``None``) every slot is priced and the choice is exactly the exhaustive one
(``tests/router/routing/test_conductor_shortlist.py`` compares them).

Given a :class:`router.routing.slot_table.SlotTable` rather than a list, the shortlist is built
without a pass over the slots: every slot that can differ from an idle one (a prefix holder, one
with requests of this router, of a peer or of the engine's report, one behind a shared compute
domain's queue) is ranked as above, and the idle ones come ranked already
(:mod:`router.routing.idle_slots`): the same shortlist, in the busy and held slots' time
(``tests/router/routing/test_slot_table.py`` compares the decisions).

``choose`` calls the index's ``match`` once per request (which counts one hit on the matched
nodes: that is what makes prefixes hot); it changes no other state.
"""

from __future__ import annotations

from collections.abc import Sequence

from radix_global.ops import IndexRefusal, MatchResult, StoreSpan
from radix_global.types import HolderId, PageKey, PoolId, WorkerId
from router.routing.admission import SloConfig, check_ttft, reject
from router.routing.contract import (
    CandidateEstimate,
    ClusterView,
    Decision,
    FetchPiece,
    PolicyConfigError,
    RejectReason,
    RouteRequest,
    RoutingPolicy,
    Slot,
    WorkerState,
    no_workers,
    prefill_candidates,
    slot_load,
)
from router.routing.pool_runs import pool_pages, pool_runs, store_spans, with_shared_prefix
from router.routing.routed_prefixes import RoutedPrefixes
from router.routing.shortlist import Shortlist, Shortlisted, routed_pages
from router.routing.slot_table import SlotTable
from router.routing.store_fetch import store_pieces


class ConductorPolicy(RoutingPolicy):
    name = "conductor"

    def __init__(
        self,
        fetch_ratio: float = 1.25,
        min_fetch_pages: int = 2,
        compare_fetch_cost: bool = True,
        tie_s: float = 1e-3,
        tie_rel: float = 0.01,
        price_top_k: int | None = 8,
        routed_ttl_s: float = 30.0,
        routed_settle_s: float = 5.0,
        store_runs: bool = True,
        slo: SloConfig | None = None,
    ) -> None:
        if fetch_ratio < 1.0 or min_fetch_pages < 1 or tie_s < 0 or tie_rel < 0 or (
                price_top_k is not None and price_top_k < 1) or routed_ttl_s < 0 or (
                routed_settle_s < 0):
            raise PolicyConfigError(
                "need fetch_ratio >= 1, min_fetch_pages >= 1, tie_s >= 0, tie_rel >= 0, "
                "price_top_k >= 1 (or None), routed_ttl_s >= 0 (0: off), routed_settle_s >= 0"
            )
        self.price_top_k = price_top_k
        self.fetch_ratio = fetch_ratio
        self.min_fetch_pages = min_fetch_pages
        self.compare_fetch_cost = compare_fetch_cost
        # False: a run split over a store's segments counts as its longest run in one segment
        # (the router before session 33; benchmarks compare the two)
        self.store_runs = store_runs
        self.tie_s = tie_s
        self.tie_rel = tie_rel
        # The router's one SLO (RouterConfig.slo), shared with the driver's decode
        # admission; none: no TTFT admission unless a request carries its own SLO.
        self.slo = slo or SloConfig()
        self._routed = RoutedPrefixes(ttl_s=routed_ttl_s) if routed_ttl_s > 0 else None
        self.routed_settle_s = routed_settle_s
        self._open: dict[str, tuple[Slot, Sequence[PageKey]]] = {}  # routed, not finished
        self._turn = 0
        self._shortlist = Shortlist(self._routed)
        self.index_errors = 0  # matches refused by the index (e.g. unknown namespace)

    def choose(
        self, req: RouteRequest, workers: Sequence[WorkerState], view: ClusterView, now: float
    ) -> Decision:
        candidates = prefill_candidates(req, workers)
        if not candidates:
            return no_workers(req, self.name)
        match = self._match(req, view, now)
        pools = pool_pages(match)
        shared_match = self._match(req, view, now, req.shared_keys) \
            if req.shared_keys and match is not None else None
        shared = pool_pages(shared_match) if shared_match is not None else None
        n = len(candidates)
        k = self.price_top_k
        # other routers' routings of this prompt's prefixes: one scan of its keys
        tips = self._routed.tips(req.page_keys, now) if self._routed is not None else {}
        priced: list[Shortlisted]
        if k is None:
            priced = [(i, c, None, self._routed_pages(c, req, now, tips))
                      for i, c in enumerate(candidates)]
        else:
            # a table's shortcut pays where it skips slots; with k or fewer it would skip none
            table = workers if isinstance(workers, SlotTable) and n > k else None
            priced = self._shortlist.slots(req, candidates, match, view, now, k, tips,
                                           self._turn, table)
        estimates = [self.estimate(req, c, match, view, now, pools, queue, routed, shared)
                     for _, c, queue, routed in priced]
        best = self._pick(estimates, [p[0] for p in priced], n)
        excess = check_ttft(req, best, self.slo)
        if excess is not None and not self.slo.probes(req):
            return reject(req, self.name, RejectReason.TTFT_SLO, self.slo.retry_after_s(excess),
                          estimates, best.ttft_s)
        return Decision(
            req.request_id, self.name, accepted=True, worker_id=best.worker_id,
            dp_rank=best.dp_rank,
            prefix_tokens=min(req.input_tokens, best.local_prefix_tokens + best.fetch_tokens),
            fetch_tokens=best.fetch_tokens, fetch_from=best.fetch_from,
            fetch_pieces=best.fetch_pieces,
            predicted_ttft_s=best.ttft_s, predicted_prefill_s=best.prefill_s,
            predicted_queue_s=best.queue_s, predicted_transfer_s=best.transfer_s,
            candidates=tuple(estimates), available_tokens=_available(req, view, match),
            probe=excess is not None,
        )

    def on_routed(self, req: RouteRequest, decision: Decision, now: float) -> None:
        self._turn += 1
        if self._routed is not None and decision.worker_id is not None:
            self._routed.add(decision.slot, req.page_keys, now)
            self._open[req.request_id] = (decision.slot, req.page_keys)

    def on_finished(self, request_id: str, ok: bool, now: float) -> None:
        opened = self._open.pop(request_id, None)
        if opened is not None and self._routed is not None:
            self._routed.settle(*opened, now, self.routed_settle_s)

    def on_peer_routed(self, slot: Slot, tip: PageKey, now: float) -> None:
        # the peer settles its own memory when the request ends; this router does not see
        # the end, and the index takes over once the KV events arrive
        if self._routed is not None:
            self._routed.add_tip(slot, tip, now, 2 * self.routed_settle_s)

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        if self._routed is not None:
            self._routed.forget_worker(worker_id)
        self._open = {r: o for r, o in self._open.items() if o[0][0] != worker_id}

    def estimate(
        self,
        req: RouteRequest,
        worker: WorkerState,
        match: MatchResult | None,
        view: ClusterView,
        now: float,
        pools: dict[HolderId, int] | None = None,
        queue: float | None = None,
        routed: int | None = None,
        shared: dict[HolderId, int] | None = None,
    ) -> CandidateEstimate:
        """The TTFT breakdown for one slot, choosing between recomputing and fetching.
        ``pools``: :func:`pool_pages` of ``match``, when the caller has it already; ``queue``:
        the slot's ``cost.queue_s`` at ``now``, likewise; ``routed``: its routed-prefix pages;
        ``shared``: :func:`pool_pages` of the match of ``req.shared_keys``."""
        if pools is None:
            pools = pool_pages(match)
        own = match.matched.get((worker.worker_id, worker.dp_rank)) if match is not None else None
        local_pages = own.host if own is not None else 0
        runs = pool_runs(worker, pools)  # empty without a match: pools come from it
        if req.shared_keys and worker.pool_id is not None:
            if shared is not None and worker.pool_aliases:
                runs = with_shared_prefix(worker, runs, shared, len(req.shared_keys))
            else:  # its salted pool run over the prefix may be another worker's alias keys
                runs = []
        if routed is None:
            routed = self._routed_pages(worker, req, now)
        local_pages = max(local_pages, routed)
        ps = req.page_size
        n = req.input_tokens
        local_tokens = min(n, local_pages * ps)
        if queue is None:
            queue = view.cost.queue_s(worker, now)
        prefill = view.cost.prefill_s(worker.worker_id, n, local_tokens)
        recompute = CandidateEstimate(
            worker.worker_id, worker.dp_rank, local_tokens, 0, None, queue, prefill, 0.0,
            queue + prefill, slot_load(worker, view),
        )
        # each run priced on its own holder: a longer run may sit behind a slower link or disk
        fetches = [(pool, min(n, pages * ps) - local_tokens) for pool, pages in runs
                   if self._worth_fetching(local_pages, pages)]
        spans = store_spans(req, worker, match, max((p for _, p in runs), default=0)) \
            if self.store_runs and match is not None and match.store_runs else ()
        store_tokens = min(n, spans[-1].end_page * ps) - local_tokens \
            if spans and self._worth_fetching(local_pages, spans[-1].end_page) else 0
        # the engine would not load so short a run: it recomputes it
        fetches = [(pool, t) for pool, t in fetches if t > 0 and t >= worker.pool_fetch_min_tokens]
        if store_tokens < max(1, worker.pool_fetch_min_tokens):
            store_tokens = 0
        if not fetches and not store_tokens:
            return recompute
        budget = worker.pool_prefetch_budget_tokens
        if budget and view.cost.prefetch_reserved_tokens(
                worker.slot, worker.pool_fetch_min_tokens) >= budget:
            return recompute  # its waiting requests hold the prefetch budget: it declines
        options = [_fetching(recompute, view, n, tokens, pool,
                             view.cost.transfer_s(pool, worker, tokens, now))
                   for pool, tokens in fetches]
        if store_tokens:
            options.append(_store_fetch(worker, spans, recompute, store_tokens, req, view, now))
        fetch = min(options, key=lambda e: e.ttft_s)  # a tie: the first, the worker's own pool
        if self.compare_fetch_cost and fetch.ttft_s >= recompute.ttft_s:
            return recompute
        return fetch

    def _routed_pages(self, worker: WorkerState, req: RouteRequest, now: float,
                      tips: dict[Slot, int] | None = None) -> int:
        return routed_pages(self._routed, worker, req, now, tips)

    def _worth_fetching(self, local_pages: int, pool_pages: int) -> bool:
        if pool_pages <= local_pages:
            return False
        if local_pages == 0:
            return pool_pages >= self.min_fetch_pages
        return pool_pages >= self.fetch_ratio * local_pages

    def _match(self, req: RouteRequest, view: ClusterView, now: float,
               keys: Sequence[PageKey] | None = None) -> MatchResult | None:
        keys = req.page_keys if keys is None else keys
        if view.index is None or not keys:
            return None
        try:
            return view.index.match(req.namespace, keys, now)
        except IndexRefusal:
            # E.g. no worker of this namespace registered with the index yet: route cache-blind.
            self.index_errors += 1
            return None

    def _pick(self, estimates: list[CandidateEstimate], positions: list[int] | None = None,
              n: int | None = None) -> CandidateEstimate:
        """Smallest TTFT; ties by load, then rotation over the ``n`` candidates (``positions``:
        each estimate's place among them, when only some were priced)."""
        best_ttft = min(e.ttft_s for e in estimates)
        limit = best_ttft + max(self.tie_s, self.tie_rel * best_ttft)
        if positions is None:
            positions = list(range(len(estimates)))
        total = n if n is not None else len(estimates)
        turn = self._turn
        j = min((j for j, e in enumerate(estimates) if e.ttft_s <= limit),
                key=lambda j: (estimates[j].load, estimates[j].ttft_s,
                               (positions[j] - turn) % total))
        return estimates[j]


def _available(req: RouteRequest, view: ClusterView, match: MatchResult | None) -> int | None:
    """``Decision.available_tokens``: None where the index was not read."""
    if view.index is None or (req.page_keys and match is None):
        return None
    pages = 0 if match is None else match.best_pages
    if match is not None and match.store_runs:
        pages = max(pages, *(spans[-1].end_page for spans in match.store_runs.values()))
    return min(pages, max(0, req.input_tokens - 1) // req.page_size) * req.page_size


def _fetching(recompute: CandidateEstimate, view: ClusterView, n: int, fetch_tokens: int,
              holder: PoolId, transfer_s: float,
              pieces: tuple[FetchPiece, ...] = ()) -> CandidateEstimate:
    """``recompute``'s slot fetching ``fetch_tokens`` more (from ``holder``, in ``transfer_s``)
    before the prefill of the ``n``-token prompt."""
    prefill = view.cost.prefill_s(recompute.worker_id, n,
                                  recompute.local_prefix_tokens + fetch_tokens)
    return recompute._replace(fetch_tokens=fetch_tokens, fetch_from=holder, prefill_s=prefill,
                              transfer_s=transfer_s,
                              ttft_s=recompute.queue_s + transfer_s + prefill,
                              fetch_pieces=pieces)


def _store_fetch(worker: WorkerState, spans: tuple[StoreSpan, ...],
                 recompute: CandidateEstimate, fetch_tokens: int, req: RouteRequest,
                 view: ClusterView, now: float) -> CandidateEstimate:
    """The fetch of ``fetch_tokens``, a store's run from its segments past what ``recompute``
    holds locally: each piece from its segment, in parallel; named for the segment with the
    most pages."""
    assert worker.pool_id is not None  # store_spans finds spans for a segment only
    n, ps, local_tokens = req.input_tokens, req.page_size, recompute.local_prefix_tokens
    pieces = store_pieces(
        spans, worker.pool_id, local_tokens // ps,
        lambda holder, tokens: view.cost.transfer_s(holder, worker, tokens, now),
        lambda first, end: min(n, end * ps) - max(local_tokens, first * ps))
    pages: dict[PoolId, int] = {}
    for p in pieces:
        pages[p.holder] = pages.get(p.holder, 0) + p.end_page - p.first_page
    biggest = max(pages, key=lambda h: pages[h])
    return _fetching(recompute, view, n, fetch_tokens, biggest,
                     max(p.transfer_s for p in pieces), pieces)
