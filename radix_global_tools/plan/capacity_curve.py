"""Reuse against cache capacity, from one pass over a trace (LRU stack distances).

A page is a hit in an LRU cache of ``C`` pages when fewer than ``C`` distinct pages were used
since its last use (its stack distance is at most ``C``); a prompt reuses the leading run of its
pages that are hits, so page ``j`` of a prompt counts for every capacity at least the largest
stack distance among pages ``0..j``. One pass (a Fenwick tree over use times) gives every
capacity at once: Mattson's inclusion property, which holds for LRU. Uses are ordered as the
simulator's caches order them (``radix_global_tools/simulate/instances.py``, ``PageCache``): a
prompt looks its pages up, then touches them deepest first, so a prefix ends newer than its
descendants and is evicted after them.

Pure: requests in, a :class:`CapacityCurve` out.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import NamedTuple

from radix_global_tools.simulate.workload import SimRequest, full_page_keys


class CapacityCurve(NamedTuple):
    """Reused prompt tokens against the capacity (in tokens) of one LRU cache of the trace."""

    page_tokens: int
    prompt_tokens: int  # of every request
    capacities_pages: tuple[int, ...]  # ascending: the capacities where reuse grows
    reused_tokens: tuple[int, ...]  # reused with at least that many pages (cumulative)

    def hit_rate(self, capacity_tokens: float) -> float:
        """Reused prompt tokens / prompt tokens in a cache of ``capacity_tokens`` (may be inf)."""
        pages = capacity_tokens / self.page_tokens
        i = bisect.bisect_right(self.capacities_pages, pages)
        return self.reused_tokens[i - 1] / self.prompt_tokens if i and self.prompt_tokens else 0.0

    @property
    def max_hit_rate(self) -> float:
        return self.hit_rate(math.inf)

    def capacity_for(self, hit_rate: float) -> int:
        """The smallest capacity (tokens) reaching ``hit_rate``; -1 if none does."""
        need = hit_rate * self.prompt_tokens
        if need <= 0:
            return 0
        for pages, reused in zip(self.capacities_pages, self.reused_tokens, strict=True):
            if reused >= need - 1e-9:
                return pages * self.page_tokens
        return -1


class _Fenwick:
    def __init__(self, n: int) -> None:
        self.tree = [0] * (n + 1)

    def add(self, i: int, v: int) -> None:
        while i < len(self.tree):
            self.tree[i] += v
            i += i & -i

    def prefix(self, i: int) -> int:
        s = 0
        while i > 0:
            s += self.tree[i]
            i -= i & -i
        return s


def capacity_curve(requests: Sequence[SimRequest], page_tokens: int) -> CapacityCurve:
    """The curve of ``requests`` (in arrival order) for pages of ``page_tokens``."""
    pages_of = [full_page_keys(r, page_tokens) for r in requests]
    total_uses = sum(len(k) for k in pages_of)
    marks = _Fenwick(total_uses)
    last_use: dict[int, int] = {}
    needed: dict[int, int] = {}  # capacity in pages -> tokens reused from it on
    now = 0
    for req, keys in zip(requests, pages_of, strict=True):
        worst = 0
        for j, key in enumerate(keys):
            t = last_use.get(key)
            if t is None:
                break  # never seen: this page and all after it are computed
            # distinct pages used since (and including) this one's last use
            worst = max(worst, marks.prefix(now) - marks.prefix(t - 1))
            # the last prompt token is always computed (its logits give the first output token)
            tokens = page_tokens - (1 if (j + 1) * page_tokens >= req.input_tokens else 0)
            needed[worst] = needed.get(worst, 0) + tokens
        for key in reversed(keys):
            t = last_use.get(key)
            if t is not None:
                marks.add(t, -1)
            now += 1
            marks.add(now, 1)
            last_use[key] = now
    caps = sorted(needed)
    cumulative, running = [], 0
    for c in caps:
        running += needed[c]
        cumulative.append(running)
    return CapacityCurve(page_tokens, sum(r.input_tokens for r in requests), tuple(caps),
                         tuple(cumulative))
