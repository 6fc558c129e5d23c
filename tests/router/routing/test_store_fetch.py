"""router/routing/store_fetch.py: which segment each part of a store's run is read from."""

from __future__ import annotations

from radix_global.ops import StoreSpan
from radix_global.types import PoolId
from router.routing.contract import FetchPiece
from router.routing.store_fetch import store_pieces

A, B, C = (PoolId(f"s@{x}") for x in "abc")


def spans(*parts: tuple[int, set[PoolId]]) -> list[StoreSpan]:
    return [StoreSpan(end, frozenset(segs)) for end, segs in parts]


def by_cost(cost: dict[PoolId, float]):  # seconds per token from each segment
    return lambda holder, tokens: cost[holder] * tokens


def pages(first: int, end: int) -> int:  # one token a page
    return end - first


def test_own_segment_first_then_the_previous_piece_then_the_cheapest() -> None:
    price = by_cost({A: 1.0, B: 2.0, C: 0.0})
    got = store_pieces(spans((4, {A, B}), (6, {B}), (8, {A, B}), (9, {C, A})), C, 0, price,
                       pages)
    assert got == (FetchPiece(A, 0, 4, 4.0), FetchPiece(B, 4, 8, 8.0),
                   FetchPiece(C, 8, 9, 0.0))


def test_a_segment_sends_its_pieces_as_one_transfer() -> None:
    """A conversation whose turns alternated between two workers: each segment's pieces are
    priced together (the segments send in parallel, each its own share at once)."""
    price = by_cost({A: 1.0, B: 1.0, C: 0.0})
    got = store_pieces(spans((2, {A}), (5, {B}), (9, {A})), C, 0, price, pages)
    assert got == (FetchPiece(A, 0, 2, 6.0), FetchPiece(B, 2, 5, 3.0), FetchPiece(A, 5, 9, 6.0))


def test_the_readers_local_prefix_is_not_fetched() -> None:
    price = by_cost({A: 1.0, B: 1.0, C: 1.0})
    got = store_pieces(spans((4, {A}), (6, {B})), C, 5, price, pages)
    assert got == (FetchPiece(B, 5, 6, 1.0),)
    assert store_pieces(spans((4, {A}),), C, 4, price, pages) == ()


def test_a_tie_goes_to_the_first_segment_by_name() -> None:
    price = by_cost({A: 1.0, B: 1.0, C: 1.0})
    assert store_pieces(spans((3, {B, A}),), C, 0, price, pages) == (FetchPiece(A, 0, 3, 3.0),)
