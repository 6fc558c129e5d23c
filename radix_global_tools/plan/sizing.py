"""One cluster the planner prices and simulates."""

from __future__ import annotations

from typing import NamedTuple


class Sizing(NamedTuple):
    prefill: int
    decode: int  # 0: co-located (the prefill instances decode), or TTFT-only runs
    pool_tokens: int  # 0: no pool
    bandwidth_Bps: float  # fabric bandwidth per instance (pool fetches, PD hand-off)
    disk_tokens: int = 0  # a disk tier under the pool (0: none)
    host_tokens: int | None = None  # each prefill instance's own cache (None: the profile's)
    # extra copies of hot prefixes in a pool of per-instance segments with sender congestion
    # (None: the striped pool, no sender bottleneck and no copies; docs/interfaces.md, "The
    # capacity plan file and the decode model")
    copies: int | None = None
