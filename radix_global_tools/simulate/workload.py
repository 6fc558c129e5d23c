"""The simulated workload: a Mooncake-format trace, time-scaled, optionally replicated.

Page keys: each Mooncake hash id is one 512-token block whose id already identifies the whole
prefix before it (equal ids = identical prefix), so the simulator uses the hash id itself as the
page key: one page per hash id, 512 tokens. Only full pages are keyed (``input_length // 512``),
as in ``radix_global.keys``. Copy ``c`` of the trace lives in a disjoint key range
(``c * COPY_STRIDE + hash_id``), so copies never share a page.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from radix_global.trace import TraceFormatError, parse_trace_line
from radix_global.types import PageKey

__all__ = [
    "COPY_STRIDE",
    "SimRequest",
    "TraceFormatError",
    "full_page_keys",
    "read_trace",
    "read_trace_lines",
    "regroup",
    "replicate",
    "scale_load",
]

COPY_STRIDE = 1 << 40


class SimRequest(NamedTuple):
    request_id: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    page_keys: tuple[PageKey, ...]


def read_trace_lines(
    lines: Iterable[str], limit: int = 0, where: str = "trace"
) -> list[SimRequest]:
    """Parse Mooncake JSON lines with ``radix_global.trace.parse_trace_line`` (the one trace
    parser of the project). ``limit`` > 0 keeps the first ``limit`` records. A bad line ->
    :class:`TraceFormatError` naming the line."""
    out: list[SimRequest] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if 0 < limit <= len(out):
            break
        rec = parse_trace_line(line, f"{where} line {lineno}")
        keys = tuple(PageKey(h) for h in rec.hash_ids)
        out.append(SimRequest(f"r{len(out)}", rec.timestamp_ms / 1000.0, rec.input_length,
                              rec.output_length, keys))
    return out


def read_trace(path: Path | str, limit: int = 0) -> list[SimRequest]:
    with open(path, encoding="utf-8") as fh:
        return read_trace_lines(fh, limit, str(path))


def full_page_keys(req: SimRequest, page_tokens: int) -> tuple[PageKey, ...]:
    """Keys of the prompt's full pages only (a partial last block is never cached)."""
    return req.page_keys[: req.input_tokens // page_tokens]


def scale_load(reqs: Sequence[SimRequest], rate_multiplier: float) -> list[SimRequest]:
    """Arrival rate x ``rate_multiplier``: timestamps (relative to the first) divided by it."""
    if rate_multiplier <= 0:
        raise ValueError("rate multiplier must be positive")
    if not reqs:
        return []
    t0 = reqs[0].arrival_s
    return [r._replace(arrival_s=(r.arrival_s - t0) / rate_multiplier) for r in reqs]


def replicate(reqs: Sequence[SimRequest], copies: int) -> list[SimRequest]:
    """``copies`` copies of the trace in disjoint key ranges, merged in arrival time (ties keep
    copy order)."""
    streams = [
        [
            r._replace(
                request_id=f"c{c}-{r.request_id}",
                page_keys=tuple(PageKey(c * COPY_STRIDE + k) for k in r.page_keys),
            )
            for r in reqs
        ]
        for c in range(copies)
    ]
    return list(heapq.merge(*streams, key=lambda r: r.arrival_s))


def regroup(reqs: Sequence[SimRequest], blocks_per_page: int) -> list[SimRequest]:
    """Pages of ``blocks_per_page`` trace blocks: a page's key is its last block's hash id
    (which identifies the whole prefix up to it). Only whole pages are kept."""
    if blocks_per_page < 1:
        raise ValueError("blocks_per_page must be >= 1")
    k = blocks_per_page
    return [r._replace(page_keys=r.page_keys[k - 1::k]) for r in reqs]
