"""Which segment each part of a store's run is read from (``docs/interfaces.md``, "Mooncake
Store as the L3 pool": "The run a store holds across its segments"). Pure: the caller prices a
transfer.

The spans of ``MatchResult.store_runs`` say which segments hold each stretch of the run. A
stretch is read from the reader's own segment when it holds it (no link), else from the segment
the previous piece read (one transfer fewer), else from the segment whose transfer of it is the
cheapest; consecutive stretches from one segment are one piece. A segment sends all its pieces
as one transfer (its pages of the run, after what it sends to others), and the segments send in
parallel: each piece carries its segment's whole transfer time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radix_global.ops import StoreSpan
from radix_global.types import PoolId
from router.routing.contract import FetchPiece

PriceFn = Callable[[PoolId, int], float]  # (segment, tokens) -> predicted seconds
TokensFn = Callable[[int, int], int]  # (first page, end page) -> tokens of the prompt fetched


def store_pieces(spans: Sequence[StoreSpan], own: PoolId, start_page: int, price: PriceFn,
                 tokens: TokensFn) -> tuple[FetchPiece, ...]:
    """The pieces of a fetch of the run's pages from ``start_page`` (the reader's local prefix)
    to the run's end, by a reader whose own segment is ``own``."""
    chosen: list[tuple[PoolId, int, int]] = []  # (segment, first page, end page)
    lo = 0
    for span in spans:
        first, end = max(lo, start_page), span.end_page
        lo = end
        if end <= first:
            continue
        prev = chosen[-1][0] if chosen else None
        if own in span.segments:
            holder = own
        elif prev is not None and prev in span.segments:
            holder = prev
        else:
            holder = min((PoolId(h) for h in sorted(span.segments)),
                         key=lambda h: price(h, tokens(first, end)))
        if holder == prev:
            chosen[-1] = (holder, chosen[-1][1], end)
        else:
            chosen.append((holder, first, end))
    share: dict[PoolId, int] = {}
    for h, a, b in chosen:
        share[h] = share.get(h, 0) + tokens(a, b)
    seconds = {h: price(h, t) for h, t in share.items()}
    return tuple(FetchPiece(h, a, b, seconds[h]) for h, a, b in chosen)
