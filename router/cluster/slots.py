"""Registry entries -> the policy contract's :class:`WorkerState` slots.

The life cycle of a request (route, prefill done, finished, worker gone) goes through
:class:`router.routing.driver.PolicyDriver`.
"""

from __future__ import annotations

from collections.abc import Iterable

from radix_global.types import Namespace, PoolId, WorkerId
from router.cluster.registry import WorkerEntry
from router.routing.contract import (
    WorkerState,
)


def worker_states(entries: Iterable[WorkerEntry], exclude: set[str] | None = None
                  ) -> list[WorkerState]:
    """One slot per (worker, dp rank); excluded and draining workers are not accepting."""
    out: list[WorkerState] = []
    for e in entries:
        i = e.info
        accepting = e.accepting and not (exclude and i.worker_id in exclude)
        for rank in range(i.dp_size):
            out.append(WorkerState(
                worker_id=WorkerId(i.worker_id), namespace=Namespace(i.namespace), dp_rank=rank,
                dp_size=i.dp_size, role=i.role,
                pool_id=PoolId(i.pool_id) if i.pool_id else None, url=i.url,
                accepting=accepting, pool_aliases=i.pool_aliases and i.pool_id is not None,
                pool_disk_id=PoolId(i.pool_disk_id) if i.pool_disk_id else None,
                pool_fetch_min_tokens=i.pool_fetch_min_tokens,
                pool_prefetch_budget_tokens=i.pool_prefetch_budget_tokens))
    return out
