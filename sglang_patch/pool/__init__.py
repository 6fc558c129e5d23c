"""L3 page pools: the :class:`~sglang_patch.pool.base.PagePool` contract and its implementations."""

from sglang_patch.pool.base import EvictedPage, PagePool, PoolError, PoolStats, PutResult

__all__ = ["EvictedPage", "PagePool", "PoolError", "PoolStats", "PutResult"]
