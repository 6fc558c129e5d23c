"""Open the L3 pool a storage backend's extra config names (``sglang_patch/storage.py``)."""

from __future__ import annotations

import socket
from typing import Any

from sglang_patch.pool.base import PagePool, PoolError
from sglang_patch.pool.shm_pool import DEFAULT_ROOT, ShmPagePool

DEFAULT_CAPACITY_BYTES = 1 << 30


def open_pool(config: dict[str, Any], page_bytes: int) -> PagePool:
    """The pool named by the extra config: ``pool`` ``shm`` (default) or ``mooncake`` (with
    ``mooncake_master`` and ``mooncake_local_hostname``; the segment is the pool capacity;
    ``pool_resync_spread``: a written page is probed at most every that many resync rounds;
    ``pool_read_stall_s``: how long a transfer waits on a silent peer)."""
    kind = config.get("pool", "shm")
    if kind == "mooncake":
        from sglang_patch.pool.mooncake_pool import DEFAULT_PROBE_SPREAD, MooncakePagePool
        from sglang_patch.pool.mooncake_stall import stall_seconds

        if not config.get("mooncake_master"):
            raise PoolError("pool mooncake without mooncake_master (HOST:PORT)")
        return MooncakePagePool(str(config.get("pool_id") or "mooncake"), page_bytes,
                                str(config["mooncake_master"]),
                                str(config.get("mooncake_local_hostname") or socket.gethostname()),
                                int(config.get("pool_capacity_bytes", DEFAULT_CAPACITY_BYTES)),
                                probe_spread=int(config.get("pool_resync_spread",
                                                            DEFAULT_PROBE_SPREAD)),
                                read_stall_s=stall_seconds(config))
    if kind != "shm":
        raise PoolError(f"unknown pool kind {kind!r} (known: shm, mooncake)")
    return ShmPagePool(
        str(config.get("pool_id") or f"shm-{socket.gethostname()}"),
        page_bytes,
        int(config.get("pool_capacity_bytes", DEFAULT_CAPACITY_BYTES)),
        root=str(config.get("pool_root", DEFAULT_ROOT)),
    )
