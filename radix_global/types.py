"""Identities shared by every part of radix-global.

Distinct identities get distinct types so that a worker id can never be passed where a pool id or a
page key is expected. Everything here is pure data: no I/O.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import NamedTuple, NewType

WorkerId = NewType("WorkerId", str)
"""A serving engine process (one SGLang/vLLM server), unique in the cluster."""

PoolId = NewType("PoolId", str)
"""An L3 page pool (the embedded shared-memory pool of one machine, or a Mooncake Store)."""

HolderId = WorkerId | PoolId
"""Whoever holds a page: a worker (tiers L1/L2) or a pool (tier L3). Ids of both kinds share one
space; registration refuses a pool id equal to a worker id."""

Namespace = NewType("Namespace", str)
"""A model namespace, ``"<model>@<version>"``: each namespace has its own tree and page size, so KV
of another model or model version can never match."""

PageKey = NewType("PageKey", int)
"""Our internal page key: a signed int64, equal to SGLang's KV-event block hash for an
unsalted page, i.e. ``hash_str_to_int64`` of the page's storage digest (see ``keys.py``)."""

PoolPageKey = NewType("PoolPageKey", str)
"""SGLang's HiCache storage key of a page: the 64-hex-digit SHA-256 chain digest."""

EngineHash = NewType("EngineHash", int)
"""A block hash exactly as an engine published it in a KV event (int64, engine-specific seed)."""


class Tier(IntEnum):
    """Where a page lives. Lower is faster; a holder may hold one page at several tiers."""

    GPU = 1  # L1: device memory of the worker
    HOST = 2  # L2: host memory of the worker (SGLang HiCache)
    POOL = 3  # L3: a shared pool reachable by every worker declaring its pool id


class Location(NamedTuple):
    """One copy of a page: who holds it, on which data-parallel rank, at which tier."""

    holder: HolderId
    dp_rank: int
    tier: Tier


class Role(StrEnum):
    """Worker role, taken from SGLang's ``--disaggregation-mode`` (``null`` -> ``mixed``)."""

    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"
