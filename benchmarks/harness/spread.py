"""Repeated measurements: the order of each round (:func:`rotated`) and the result as median and
range (:func:`median_spread`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(items: Sequence[T], r: int) -> list[T]:
    """Round ``r``'s order: ``items`` rotated left by ``r`` (machine drift hits each alike)."""
    k = r % len(items) if items else 0
    return [*items[k:], *items[:k]]


def median_spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def spread_text(v: dict[str, float], fmt: str) -> str:
    """A :func:`median_spread` as ``median (min-max)``."""
    return f"{v['median']:{fmt}} ({v['min']:{fmt}}-{v['max']:{fmt}})"
