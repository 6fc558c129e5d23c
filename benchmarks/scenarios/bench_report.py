"""The side-by-side run's outputs: one table (stdout), a TTFT CDF plot (PNG), a JSON file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = (("contender", "contender", "{}"), ("n", "requests", "{}"), ("ok", "ok", "{}"),
           ("rej", "rejected", "{}"), ("fail", "failed", "{}"),
           ("TTFT mean", "ttft_mean_s", "ms"), ("p50", "ttft_p50_s", "ms"),
           ("p90", "ttft_p90_s", "ms"), ("p99", "ttft_p99_s", "ms"),
           ("TBT p90", "tbt_p90_s", "ms"), ("SLO", "slo_attainment", "pct"),
           ("goodput/s", "goodput_rps", "{:.3f}"), ("reused", "prefix_reuse_fraction", "pct"),
           ("pool tok", "pool_tokens_loaded", "{}"), ("MB moved", "bytes_moved", "mb"))


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "ms":
        return f"{value * 1000:.0f}"
    if fmt == "pct":
        return f"{value * 100:.0f}%"
    if fmt == "mb":
        return f"{value / 1e6:.1f}"
    return fmt.format(value)


def table(rows: Sequence[dict[str, Any]],
          columns: Sequence[tuple[str, str, str]] = COLUMNS, left: int = 1) -> str:
    """Plain-text table, one row per contender (``rows``: summary dicts plus ``contender``);
    ``columns``: (header, key, format) each; the first ``left`` columns are left-aligned."""
    cells = [[h for h, _, _ in columns]]
    for row in rows:
        if row.get("skipped"):
            cells.append([_cell(row.get(key), fmt) for _, key, fmt in columns[:left]]
                         + [f"skipped: {row['skipped']}"] + [""] * (len(columns) - left - 1))
            continue
        cells.append([_cell(row.get(key), fmt) for _, key, fmt in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) if i < left else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def cdf_plot(ttfts: dict[str, list[float]], path: Path, title: str) -> Path | None:
    """TTFT CDF per contender; None when matplotlib is missing or nothing to plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not any(ttfts.values()):
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, values in ttfts.items():
        if not values:
            continue
        xs = sorted(values)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=name, linewidth=2 if "headline" in name else 1)
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, path)


def save_figure(fig: Any, path: Path) -> Path:
    """Write a matplotlib figure as a PNG (folders made) and release it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path
