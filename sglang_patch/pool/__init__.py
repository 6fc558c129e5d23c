"""L3 page pools: the :class:`~sglang_patch.pool.base.PagePool` contract and its implementations."""

from sglang_patch.pool.base import (
    CorruptReason,
    EvictedPage,
    PagePool,
    PoolCorrupt,
    PoolError,
    PoolStats,
    PutResult,
)

__all__ = ["CorruptReason", "EvictedPage", "PagePool", "PoolCorrupt", "PoolError", "PoolStats",
           "PutResult"]
