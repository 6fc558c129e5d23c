"""The planner's trade-off table and plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from radix_global_tools.plan.capacity_curve import CapacityCurve
from radix_global_tools.plan.search import Candidate

GIB = 2**30
CURVE_POINTS = (1e6, 3e6, 1e7, 3e7, 5e7, 1e8)  # tokens


def tradeoff_table(cands: Sequence[Candidate], kv_bytes_per_token: int, colocated: bool) -> Table:
    t = Table(title="Clusters meeting both SLOs for the accepted share (cheapest first)")
    copies = any(c.outcome.sizing.copies is not None for c in cands)
    for col in ("", "fabric Gbit/s", "pool GiB", *(("copies",) if copies else ()), "disk GiB",
                "host GiB / inst.", "hit rate", "prefill",
                "decode" if not colocated else "decode (co-located)", "met both",
                "p99 TTFT s", "p99 TBT ms", "cost / h"):
        t.add_column(col, justify="right")
    for c in cands:
        o, s = c.outcome, c.outcome.sizing
        t.add_row("plan" if c.chosen else "", f"{s.bandwidth_Bps * 8 / 1e9:g}",
                  f"{s.pool_tokens * kv_bytes_per_token / GIB:,.1f}",
                  *((str(s.copies),) if copies else ()),
                  f"{s.disk_tokens * kv_bytes_per_token / GIB:,.1f}",
                  f"{(s.host_tokens or 0) * kv_bytes_per_token / GIB:,.2f}", f"{o.hit_rate:.3f}",
                  str(s.prefill), str(s.decode) if not colocated else "-",
                  f"{o.both_share:.3f}", f"{o.p99_ttft_s:.2f}", f"{o.p99_tbt_s * 1000:.1f}",
                  f"{c.cost:,.2f}")
    return t


def curve_table(curve: CapacityCurve, kv_bytes_per_token: int) -> Table:
    t = Table(title="Reuse against pool capacity (one LRU pass over the trace)")
    t.add_column("capacity (tokens)", justify="right")
    t.add_column("GiB", justify="right")
    t.add_column("hit rate", justify="right")
    for tokens in (*CURVE_POINTS, float("inf")):
        gib = "unbounded" if tokens == float("inf") else f"{tokens * kv_bytes_per_token / GIB:,.0f}"
        t.add_row("unbounded" if tokens == float("inf") else f"{tokens:,.0f}", gib,
                  f"{curve.hit_rate(tokens):.4f}")
    return t


def plot(path: Path, curve: CapacityCurve, cands: Sequence[Candidate], kv_bytes_per_token: int,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = [max(1, c) * curve.page_tokens for c in curve.capacities_pages]
    ys = [r / curve.prompt_tokens for r in curve.reused_tokens]
    left.step(xs, ys, where="post")
    left.set_xscale("log")
    left.set_xlabel("pool capacity (tokens)")
    left.set_ylabel("hit rate (reused prompt tokens)")
    left.set_title("Reuse against capacity (LRU)")
    best = next((c for c in cands if c.chosen), None)
    if best is not None and best.outcome.sizing.pool_tokens:
        left.axvline(best.outcome.sizing.pool_tokens, color="red", linestyle="--", label="plan")
        left.legend()
    for bw, copies in sorted({(c.outcome.sizing.bandwidth_Bps, c.outcome.sizing.copies or 0)
                              for c in cands}):
        mine = sorted((c for c in cands if c.outcome.sizing.bandwidth_Bps == bw
                       and (c.outcome.sizing.copies or 0) == copies),
                      key=lambda c: c.outcome.sizing.pool_tokens)
        right.plot([c.outcome.sizing.pool_tokens * kv_bytes_per_token / GIB for c in mine],
                   [c.cost for c in mine], marker="o",
                   label=f"{bw * 8 / 1e9:g} Gbit/s" + (f", {copies} copies" if copies else ""))
        for c in mine:
            s = c.outcome.sizing
            right.annotate(f"{s.prefill}P" + (f"+{s.decode}D" if s.decode else ""),
                           (s.pool_tokens * kv_bytes_per_token / GIB, c.cost), fontsize=8)
    right.set_xlabel("pool (GiB)")
    right.set_ylabel("cost per hour")
    right.set_title("Cheapest cluster per pool size and fabric (and copies)")
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
