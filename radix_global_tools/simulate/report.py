"""Printing and saving simulator results: rich tables, one JSON file, a PNG of TTFT vs load."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

LABELS = {
    "random": "random",
    "load_balancing": "load-balancing (least_load)",
    "local_cache_aware": "local cache-aware (conductor, no pool)",
    "local_cache_aware_approx": "local cache-aware (approx_cache)",
    "global_cache_aware": "global cache-aware (conductor + pool)",
}


def _f(x: float, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def fig5_table(res: Mapping[str, list[dict[str, Any]]], paper: Mapping[str, float],
               oracle: float | None = None) -> Table:
    labels = list(res)
    loads = [row["load"] for row in res[labels[0]]]
    t = Table(title="Fig. 5: mean TTFT (s) vs load (arrival-rate multiplier)")
    t.add_column("policy")
    t.add_column("paper", justify="right")
    for load in loads:
        t.add_column(f"x{load:g}", justify="right")
    for label in labels:
        t.add_row(LABELS.get(label, label), _f(paper.get(label, float("nan"))),
                  *[_f(row["mean_ttft_s"]) for row in res[label]])
    if {"global_cache_aware", "load_balancing", "local_cache_aware"} <= set(res):
        g = res["global_cache_aware"]
        for other, target in (("load_balancing", 0.58), ("local_cache_aware", 0.86)):
            pairs = zip(g, res[other], strict=True)
            ratios = [a["mean_ttft_s"] / b["mean_ttft_s"] for a, b in pairs]
            paper_ratio = paper.get("global_cache_aware", math.nan) / paper.get(other, math.nan)
            t.add_row(f"global / {other} (target <= {target})", _f(paper_ratio),
                      *[_f(r) for r in ratios], style="bold")
    if oracle is not None:
        t.add_row("oracle bound (no queue, every earlier page reused)", "",
                  *[_f(oracle) for _ in loads])
        for other in ("load_balancing", "local_cache_aware"):
            if other in res:
                t.add_row(f"best attainable / {other}", "",
                          *[_f(oracle / row["mean_ttft_s"]) for row in res[other]])
    return t


def fig10_table(res: Mapping[str, Any], paper_hit: float, paper_prefill: float) -> Table:
    t = Table(title="Fig. 10: global pool vs local caches (10 instances x 3M tokens each)")
    for col in ("metric", "local, conductor", "local, least_load", "global pool",
                "global/local conductor", "global/local least_load", "paper ratio"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    lc, ll, glo = (res[k] for k in ("local_cache_aware", "load_balancing", "global_cache_aware"))
    t.add_row("cache hit rate", _f(lc["hit_rate"], 3), _f(ll["hit_rate"], 3),
              _f(glo["hit_rate"], 3), _f(res["hit_rate_ratio_vs_local_cache_aware"]),
              _f(res["hit_rate_ratio_vs_load_balancing"]), _f(paper_hit))
    t.add_row("prefill compute (s)", _f(lc["prefill_compute_s"], 0),
              _f(ll["prefill_compute_s"], 0), _f(glo["prefill_compute_s"], 0),
              _f(res["prefill_time_ratio_vs_local_cache_aware"]),
              _f(res["prefill_time_ratio_vs_load_balancing"]), _f(paper_prefill))
    t.add_row("mean TTFT (s)", _f(lc["mean_ttft_s"]), _f(ll["mean_ttft_s"]),
              _f(glo["mean_ttft_s"]), "", "", "")
    return t


def admission_table(res: Mapping[str, Any], slo: float) -> Table:
    t = Table(title=f"Early rejection under overload (TTFT SLO {slo:g} s)")
    for col in ("run", "accepted", "rejected", "SLO attainment", "goodput (req/s)", "mean TTFT"):
        t.add_column(col, justify="right" if col != "run" else "left")
    for col in ("false rej. (truth)", "estimated"):
        t.add_column(col, justify="right")
    for label in ("without_admission", "with_admission", "with_admission_headroom"):
        r = res[label]
        f = r["false_rejections"]
        t.add_row(label, str(r["accepted"]), str(r["rejected"]), _f(r["slo_attainment"], 3),
                  _f(r["goodput_rps"], 3), _f(r["mean_ttft_s"]), str(f["truth"]),
                  _f(f["estimate"], 1))
    return t


def scale_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Scale: conductor decision time and index memory")
    for col in ("instances", "requests", "decision mean (us)", "decision p99 (us)",
                "index pages", "index MiB"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["instances"]), str(r["requests"]), _f(r["mean_decision_us"], 0),
                  _f(r["p99_decision_us"], 0), str(r["index_pages"]),
                  _f(r["index_memory_bytes"] / 2**20, 1))
    return t


def save_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=float, allow_nan=True) + "\n")


def plot_fig5(path: Path, res: Mapping[str, list[dict[str, Any]]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rows in res.items():
        ax.plot([r["load"] for r in rows], [r["mean_ttft_s"] for r in rows], marker="o",
                label=LABELS.get(label, label))
    ax.set_xlabel("load (arrival-rate multiplier of the trace)")
    ax.set_ylabel("mean TTFT (s)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_tables(console: Console, *tables: Table) -> None:
    for t in tables:
        console.print(t)
