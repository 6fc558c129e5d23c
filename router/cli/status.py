"""``radix-global status --router URL``: the cluster at a glance (workers, load, hit rates,
decisions, index, diagnostics), from the router's ``/admin/stats`` and ``/admin/diagnostics``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table


def render(stats: dict[str, Any], diag: dict[str, Any], console: Console) -> None:
    console.print(f"[bold]radix-global router[/bold]  policy={stats.get('policy')}  "
                  f"uptime={stats.get('uptime_s', 0):.0f}s  in-flight={stats.get('outstanding')}")
    table = Table("worker", "model", "namespace", "role", "state", "routed", "in-flight",
                  "hit rate", "failures", "kv events")
    for w in stats.get("workers", []):
        hit = w.get("hit_rate")
        table.add_row(
            w["worker_id"], w["model"], w["namespace"], w["role"],
            "draining" if w.get("draining") else "ok", str(w.get("routed", 0)),
            str(w.get("outstanding", 0)), "-" if hit is None else f"{hit:.1%}",
            str(w.get("failures", 0)), "yes" if w.get("kv_events_endpoint") else "no")
    console.print(table)
    totals = stats.get("totals", {})
    if totals:
        console.print("totals: " + ", ".join(f"{k}={v}" for k, v in sorted(totals.items())))
    index = stats.get("index", {})
    keys = ("mode", "namespaces", "pages", "nodes", "holders", "ops_applied")
    console.print("index: " + ", ".join(f"{k}={index[k]}" for k in keys if k in index))
    pd = stats.get("pd")
    if pd:  # prefill/decode pools (router/pd/pool_front.py)
        pre, dec = pd["prefill"], pd["decode"]
        console.print(f"pd ({pd['mode']}): prefill {pre['workers']} at {pre['utilization']:.1%}, "
                      f"decode {dec['workers']} at {dec['utilization']:.1%} over "
                      f"{pd['window_s']:.0f}s; ratio {pd['configured_ratio']} (suggested "
                      f"{pd['suggested_ratio']}); rejected before prefill "
                      f"{pd['rejected_before_prefill']}, decode retries {pd['decode_retries']}")
    findings = diag.get("findings", [])
    for f in findings:
        console.print(f"[yellow]! {f.get('worker_id', '')} {f['problem']}[/yellow]: "
                      f"{f.get('detail', '')}")
    if not findings:
        console.print("[green]no diagnostics[/green]")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radix-global status", description=__doc__.splitlines()[0])
    p.add_argument("--router", default="http://127.0.0.1:30080")
    p.add_argument("--admin-token", default=os.environ.get("RADIX_GLOBAL_ADMIN_TOKEN"))
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    headers = {"Authorization": f"Bearer {args.admin_token}"} if args.admin_token else {}
    console = Console()
    try:
        with httpx.Client(base_url=args.router.rstrip("/"), headers=headers, timeout=5) as c:
            stats, diag = c.get("/admin/stats"), c.get("/admin/diagnostics")
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach {args.router}: {exc}[/red]")
        return 1
    if stats.status_code != 200:
        console.print(f"[red]{args.router}/admin/stats: HTTP {stats.status_code}[/red] "
                      f"{stats.text}")
        return 1
    render(stats.json(), diag.json() if diag.status_code == 200 else {}, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
