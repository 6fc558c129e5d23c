"""``radix-global status --router URL``: the cluster at a glance (workers, load, hit rates,
decisions, what the cache was worth, admission, index, diagnostics), from the router's
``/admin/stats`` and ``/admin/diagnostics``; ``--watch S`` redraws it every S seconds."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import httpx
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text


def view(stats: dict[str, Any], diag: dict[str, Any]) -> Group:
    """Everything the command shows, as one renderable."""
    out: list[RenderableType] = [Text.from_markup(
        f"[bold]radix-global router[/bold]  policy={stats.get('policy')}  "
        f"uptime={stats.get('uptime_s', 0):.0f}s  in-flight={stats.get('outstanding')}")]
    table = Table("worker", "model", "namespace", "role", "state", "routed", "in-flight",
                  "hit rate", "failures", "kv events")
    for w in stats.get("workers", []):
        hit = w.get("hit_rate")
        table.add_row(
            w["worker_id"], w["model"], w["namespace"], w["role"],
            "draining" if w.get("draining") else "ok", str(w.get("routed", 0)),
            str(w.get("outstanding", 0)), "-" if hit is None else f"{hit:.1%}",
            str(w.get("failures", 0)), "yes" if w.get("kv_events_endpoint") else "no")
    out.append(table)
    out += _worth(stats)
    totals = stats.get("totals", {})
    if totals:
        out.append(Text("totals: " + ", ".join(f"{k}={v}" for k, v in sorted(totals.items()))))
    index = stats.get("index", {})
    keys = ("mode", "namespaces", "pages", "nodes", "holders", "ops_applied")
    out.append(Text("index: " + ", ".join(f"{k}={index[k]}" for k in keys if k in index)))
    pd = stats.get("pd")
    if pd:  # prefill/decode pools (router/pd/pool_front.py)
        pre, dec = pd["prefill"], pd["decode"]
        out.append(Text(
            f"pd ({pd['mode']}): prefill {pre['workers']} at {pre['utilization']:.1%}, "
            f"decode {dec['workers']} at {dec['utilization']:.1%} over "
            f"{pd['window_s']:.0f}s; ratio {pd['configured_ratio']} (suggested "
            f"{pd['suggested_ratio']}); rejected before prefill "
            f"{pd['rejected_before_prefill']}, decode retries {pd['decode_retries']}"))
    findings = diag.get("findings", [])
    for f in findings:
        out.append(Text.from_markup(f"[yellow]! {f.get('worker_id', '')} {f['problem']}"
                                    f"[/yellow]: {f.get('detail', '')}"))
    if not findings:
        out.append(Text.from_markup("[green]no diagnostics[/green]"))
    return Group(*out)


def _worth(stats: dict[str, Any]) -> list[RenderableType]:
    """Per model: the reuse funnel and seconds saved; acceptance and SLOs met."""
    economics = stats.get("economics") or {}
    admission = (stats.get("admission") or {}).get("models", {})
    if not economics and not admission:
        return []
    table = Table("model", "prompt tok", "available", "captured", "delivered", "late",
                  "prefill s saved", "accepted", "rejected", "TTFT met", "false rej. (probes)")
    for model in sorted({*economics, *admission}):
        e, a = economics.get(model, {}), admission.get(model, {})
        table.add_row(
            model, *(str(e.get(k, "-")) for k in ("prompt_tokens", "available_tokens",
                                                   "captured_tokens", "delivered_tokens",
                                                   "late_tokens")),
            f"{e.get('prefill_saved_s', 0.0):.2f}", str(a.get("accepted", 0)),
            str(sum((a.get("rejected") or {}).values())), _share(a.get("ttft_attainment")),
            _share(a.get("false_rejection_share_probes")))
    return [table]


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def fetch(client: httpx.Client) -> tuple[dict[str, Any], dict[str, Any]]:
    """``/admin/stats`` and ``/admin/diagnostics``; :class:`RuntimeError` with a line to
    print when the router cannot be read."""
    try:
        stats, diag = client.get("/admin/stats"), client.get("/admin/diagnostics")
    except httpx.HTTPError as exc:
        raise RuntimeError(f"cannot reach {client.base_url}: {exc}") from exc
    if stats.status_code != 200:
        raise RuntimeError(f"{client.base_url}/admin/stats: HTTP {stats.status_code} "
                           f"{stats.text}")
    try:
        return stats.json(), diag.json() if diag.status_code == 200 else {}
    except ValueError as exc:
        raise RuntimeError(f"{client.base_url}: not the router's JSON ({exc})") from exc


def _redraw(client: httpx.Client) -> RenderableType:
    """The next frame of ``--watch``: a router that stopped answering is a line on the screen,
    and the watch goes on (it may come back)."""
    try:
        return view(*fetch(client))
    except RuntimeError as exc:
        return Text.from_markup(f"[red]{exc}[/red] (retrying)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radix-global status", description=__doc__.splitlines()[0])
    p.add_argument("--router", default="http://127.0.0.1:30080")
    p.add_argument("--admin-token", default=os.environ.get("RADIX_GLOBAL_ADMIN_TOKEN"))
    p.add_argument("--watch", type=float, metavar="S", default=None,
                   help="redraw every S seconds until interrupted")
    p.add_argument("--count", type=int, default=None,
                   help="with --watch: stop after this many redraws")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.watch is not None and not args.watch > 0:
        p.error("--watch must be a positive number of seconds")
    headers = {"Authorization": f"Bearer {args.admin_token}"} if args.admin_token else {}
    console = Console()
    with httpx.Client(base_url=args.router.rstrip("/"), headers=headers, timeout=5) as c:
        try:
            if args.watch is None:
                console.print(view(*fetch(c)))
                return 0
            with Live(view(*fetch(c)), console=console, auto_refresh=False) as live:
                shown = 1
                while args.count is None or shown < args.count:
                    time.sleep(args.watch)
                    live.update(_redraw(c), refresh=True)
                    shown += 1
        except RuntimeError as exc:
            console.print(f"[red]{exc}[/red]")
            return 1
        except KeyboardInterrupt:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
