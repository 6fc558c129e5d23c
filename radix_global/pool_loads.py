"""What a worker's pool backend tells the router about the loads it timed (``docs/interfaces.md``,
"Where hosts are"): ``POST /admin/pool-loads``. Pure: the record, its checks and its encoding.

One :class:`PoolLoad` per ``batch_get`` call that read pages from the pool's memory tier:
``first`` its first page key (the router knows which holder it planned that page from),
``pages``, ``bytes`` and the wall ``seconds`` the read took in the backend.
"""

from __future__ import annotations

import math

import msgspec

MAX_LOADS_PER_REPORT = 256
_INT64 = (-(1 << 63), (1 << 63) - 1)


class PoolLoadError(ValueError):
    """A report that cannot be used: the message names the field."""


class PoolLoad(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    first: int  # the first page key read (signed int64, docs/interfaces.md "Page keys")
    pages: int
    bytes: int
    seconds: float


class PoolLoadReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pool_id: str  # the reporting backend's own pool id: where the pages went
    loads: list[PoolLoad]


_DECODER = msgspec.json.Decoder(PoolLoadReport)


def decode_report(body: bytes) -> PoolLoadReport:
    """The report in ``body``; :class:`PoolLoadError` naming what is wrong."""
    try:
        report = _DECODER.decode(body)
    except msgspec.DecodeError as exc:
        raise PoolLoadError(str(exc)) from None
    if not report.pool_id or len(report.pool_id) > 256 or not report.pool_id.isprintable():
        raise PoolLoadError("pool_id must be 1 to 256 printable characters")
    if len(report.loads) > MAX_LOADS_PER_REPORT:
        raise PoolLoadError(f"loads: at most {MAX_LOADS_PER_REPORT} a report, "
                            f"got {len(report.loads)}")
    for i, load in enumerate(report.loads):
        if not _INT64[0] <= load.first <= _INT64[1]:
            raise PoolLoadError(f"loads[{i}].first must be a signed 64-bit page key")
        if load.pages < 1 or load.bytes < 1:
            raise PoolLoadError(f"loads[{i}]: pages and bytes must be >= 1")
        if not (math.isfinite(load.seconds) and load.seconds > 0):
            raise PoolLoadError(f"loads[{i}].seconds must be a positive finite number")
    return report


def encode_report(report: PoolLoadReport) -> bytes:
    return msgspec.json.encode(report)
