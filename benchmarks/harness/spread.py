"""Repeated measurements as median and range (the Mooncake and shared-prompt benchmarks)."""

from __future__ import annotations

import statistics


def median_spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def spread_text(v: dict[str, float], fmt: str) -> str:
    """A :func:`median_spread` as ``median (min-max)``."""
    return f"{v['median']:{fmt}} ({v['min']:{fmt}}-{v['max']:{fmt}})"
