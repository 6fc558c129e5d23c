"""``approx_cache``: cache affinity without KV events, like SGLang router's ``cache_aware``.

The router remembers, per slot, the page keys of the prompts it sent there
(:class:`router.routing.routed_prefixes.RoutedPrefixes`, an LRU bounded at ``max_pages_per_slot``:
an approximation of the slot's cache, with no eviction signal).

Rule (per request): if the load is imbalanced (``max - min > balance_abs`` and
``max > balance_rel * min``) -> least load; else the slot with the longest match if that match
covers more than ``cache_threshold`` of the prompt's pages -> that slot; else least load.
"""

from __future__ import annotations

from collections.abc import Sequence

from radix_global.types import PageKey, WorkerId
from router.routing.contract import (
    ClusterView,
    Decision,
    PolicyConfigError,
    RouteRequest,
    RoutingPolicy,
    Slot,
    WorkerState,
    no_workers,
    prefill_candidates,
    route_to,
    slot_load,
)
from router.routing.routed_prefixes import RoutedPrefixes


class ApproxCachePolicy(RoutingPolicy):
    name = "approx_cache"

    def __init__(
        self,
        cache_threshold: float = 0.3,
        balance_abs: int = 32,
        balance_rel: float = 1.5,
        max_pages_per_slot: int = 100_000,
    ) -> None:
        if not 0 <= cache_threshold <= 1 or balance_abs < 0 or balance_rel < 1:
            raise PolicyConfigError("need 0<=cache_threshold<=1, balance_abs>=0, balance_rel>=1")
        if max_pages_per_slot < 1:
            raise PolicyConfigError("max_pages_per_slot must be >= 1")
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self._routed = RoutedPrefixes(max_pages_per_slot)
        self._turn = 0

    def choose(
        self, req: RouteRequest, workers: Sequence[WorkerState], view: ClusterView, now: float
    ) -> Decision:
        candidates = prefill_candidates(req, workers)
        if not candidates:
            return no_workers(req, self.name)
        loads = [slot_load(w, view) for w in candidates]
        lo, hi = min(loads), max(loads)
        imbalanced = hi - lo > self.balance_abs and hi > self.balance_rel * lo
        if not imbalanced and req.page_keys:
            matches = [self.match_pages(w.slot, req.page_keys) for w in candidates]
            best = max(range(len(candidates)), key=lambda i: (matches[i], -loads[i]))
            if matches[best] > self.cache_threshold * len(req.page_keys):
                prefix = min(req.input_tokens, matches[best] * req.page_size)
                return route_to(req, self.name, candidates[best], view, now, prefix)
        n = len(candidates)
        least = min(range(n), key=lambda i: (loads[i], (i - self._turn) % n))
        return route_to(req, self.name, candidates[least], view, now)

    def match_pages(self, slot: Slot, keys: Sequence[PageKey]) -> int:
        """Leading pages of ``keys`` this router believes ``slot`` holds."""
        return self._routed.match(slot, keys, 0.0)

    def on_routed(self, req: RouteRequest, decision: Decision, now: float) -> None:
        self._turn += 1
        if decision.worker_id is not None:
            self._routed.add(decision.slot, req.page_keys, now)

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        self._routed.forget_worker(worker_id)

    def tracked_pages(self, slot: Slot) -> int:
        return self._routed.pages(slot)
