"""Typed operations that feed the index, and the typed results it answers with.

Decoders (``events.py``) turn engine KV events into these; the pure index (``index.py``) applies
them. Contract in ``docs/interfaces.md`` section "Index operations".
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from radix_global.types import HolderId, Location, Namespace, PageKey, Tier


class IndexRefusal(Exception):
    """Base of every refusal by the index; always carries a reason usable as a counter label."""

    reason = "invalid"


class UnknownParentError(IndexRefusal):
    """A store names a parent page that is not in the tree."""

    reason = "unknown_parent"


class UnknownNamespaceError(IndexRefusal):
    """An operation or query names a namespace no worker registered."""

    reason = "unknown_namespace"


class PageSizeMismatchError(IndexRefusal):
    """An event or registration declares a page size other than its namespace's."""

    reason = "page_size_mismatch"


class MalformedEventError(IndexRefusal):
    """A payload that does not decode to a known event shape."""

    reason = "malformed"


class StorePages(NamedTuple):
    """``keys`` (in prefix order) now exist at ``location``, following ``parent`` (None = root)."""

    namespace: Namespace
    location: Location
    parent: PageKey | None
    keys: list[PageKey]


class RemovePages(NamedTuple):
    """``location`` no longer holds ``keys``."""

    namespace: Namespace
    location: Location
    keys: list[PageKey]


class ClearHolder(NamedTuple):
    """The holder dropped everything (``AllBlocksCleared``) at ``tier`` (None: every tier) of data
    parallel rank ``dp_rank`` (None: every rank; an engine's reset is per rank)."""

    holder: HolderId
    tier: Tier | None
    dp_rank: int | None = None


IndexOp = StorePages | RemovePages | ClearHolder


class HolderMatch(NamedTuple):
    """Longest leading run of the query's pages one (holder, dp_rank) has, by tier (in pages).

    ``gpu``: pages at tier GPU; ``host``: at GPU or HOST; ``pool``: at any tier.
    Always ``gpu <= host <= pool``.
    """

    gpu: int
    host: int
    pool: int


class StoreSpan(NamedTuple):
    """Pages of a query held by exactly ``segments`` of one store: from where the previous span
    ended (0 for the first) to ``end_page`` (exclusive)."""

    end_page: int
    segments: frozenset[HolderId]


NO_STORE_RUNS: Mapping[str, tuple[StoreSpan, ...]] = MappingProxyType({})


class MatchResult(NamedTuple):
    """Answer to ``match(namespace, keys)``."""

    query_pages: int
    matched: dict[tuple[HolderId, int], HolderMatch]  # (holder, dp_rank) -> lengths; only >0
    best_pages: int  # longest leading run held anywhere (any holder, any tier)
    best_holders: frozenset[HolderId]  # holders of that longest run
    # Per store (pool_ids.store_of) whose segments hold the first page: the spans covering its
    # leading run over all its segments (docs/interfaces.md, "Mooncake Store as the L3 pool":
    # "The run a store holds across its segments"). Empty where no segment holds the first page.
    store_runs: Mapping[str, tuple[StoreSpan, ...]] = NO_STORE_RUNS


class HotPrefix(NamedTuple):
    """A subtree with a high decayed hit rate: the path from the root to its node."""

    keys: tuple[PageKey, ...]
    pages: int
    hit_rate: float  # decayed hits per second
    holders: int  # distinct holders that have the whole prefix (any tier)
