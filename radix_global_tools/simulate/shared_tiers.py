"""The tiers every simulated instance shares: the global pool and, under it, a disk tier.

As the product's disk tier (``docs/interfaces.md``, "The persistent disk tier under the pool"):
every page the pool stores is also written to the disk (write-through), the disk is a holder of
its own (``<pool id>+disk``, at tier ``POOL``), and a fetch reads the leading run of the one
holder the router chose, priced at that holder's bandwidth: the fabric for the pool, the slower
of the disk's read and the fabric for the disk. So a page the pool evicted is still fetched,
more slowly, while the disk holds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from radix_global.ops import IndexOp
from radix_global.pool_ids import disk_holder
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId
from radix_global_tools.simulate.config import Calibration, SimConfigError
from radix_global_tools.simulate.instances import PageCache
from router.routing.contract import FetchPiece
from router.routing.cost import CostModel

POOL_ID = PoolId("pool-global")
DISK_ID = disk_holder(POOL_ID)


class SharedTiers:
    """The pool of ``pool_tokens`` and, with ``disk_tokens`` > 0, its disk tier."""

    def __init__(self, namespace: Namespace, cal: Calibration, pool_tokens: int,
                 disk_tokens: int = 0) -> None:
        self.cal = cal
        self.pool = PageCache(namespace, Location(POOL_ID, 0, Tier.POOL),
                              max(1, pool_tokens // cal.page_tokens))
        self.disk: PageCache | None = None
        if disk_tokens > 0:
            if cal.disk_read_bytes_per_s is None:
                raise SimConfigError("a disk tier needs a [disk] table in the hardware profile")
            self.disk = PageCache(namespace, Location(DISK_ID, 0, Tier.POOL),
                                  max(1, disk_tokens // cal.page_tokens))

    @property
    def disk_id(self) -> PoolId | None:
        return DISK_ID if self.disk is not None else None

    def pool_of(self, worker: WorkerId) -> PoolId:
        return POOL_ID

    def price_on(self, cost: CostModel) -> None:
        """Tell the router's cost model what a disk fetch costs, as a worker's registration
        does (``WorkerInfo.pool_disk_read_Bps``)."""
        if self.disk is not None:
            cost.set_holder_bandwidth(DISK_ID, self.cal.disk_fetch_Bps)

    def fetch(self, keys: Sequence[PageKey], local_pages: int, wanted_pages: int,
              holder: PoolId | None, touch: bool, now: float = 0.0,
              reader: WorkerId | None = None,
              pieces: Sequence[FetchPiece] = ()) -> tuple[int, float]:
        """Pages fetched past the ``local_pages`` an instance holds, up to ``wanted_pages``, from
        ``holder`` (the router's choice; None or the pool: the pool), and the time it takes;
        ``touch``: the hits are taken now. The pool is striped over every node, so no sender is
        a bottleneck: ``now``, ``reader`` and ``pieces`` do not matter here (they do for
        segments)."""
        from_disk = holder == DISK_ID and self.disk is not None
        cache = self.disk if from_disk and self.disk is not None else self.pool
        held = cache.prefix_pages(keys)
        if touch:
            cache.touch(keys[:held])
        fetched = max(0, min(held, wanted_pages) - local_pages)
        tokens = fetched * self.cal.page_tokens
        return fetched, self.cal.disk_fetch_s(tokens) if from_disk else self.cal.fetch_s(tokens)

    def store(self, keys: Sequence[PageKey], writer: WorkerId) -> list[IndexOp]:
        """A computed prompt's pages, written through to the pool and the disk (one pool: the
        writer does not matter)."""
        ops = self.pool.insert(keys)
        if self.disk is not None:
            ops += self.disk.insert(keys)
        return ops
