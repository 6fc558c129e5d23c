"""How far our router's predicted TTFT was off, against how busy the chosen engine was.

    python -m benchmarks.scenarios.ttft_residual [--real benchmarks/results/pressure.json]

For each of our contenders' runs in a cache-pressure result
(``benchmarks/scenarios/pressure_bench.py``, requests that carry the router's ``router_ttft_s``) and
each worker: the median of ``measured - predicted`` TTFT, grouped by the requests of that worker
still in flight (sent, not finished, as the client saw them) when the request was sent. This is the
evidence behind the cost model's drag of a slot's requests (``router/routing/drag_model.py``,
``docs/benchmarks-archive.md`` run 9): a residual that grows with the count is work the
router's FIFO of prefills does not see. Pure functions and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import RESULTS
from radix_global_tools.replay.stats import RequestResult

MAX_GROUP = 4  # in-flight counts from here up are one group ("4+")


def in_flight_at_send(r: RequestResult, same_worker: Sequence[RequestResult]) -> int:
    """The others of ``same_worker`` that were sent before ``r`` and had not finished."""
    return sum(1 for o in same_worker if o is not r and o.latency_s is not None
               and o.sent_s <= r.sent_s < o.sent_s + o.latency_s)


def residuals_by_in_flight(results: Sequence[RequestResult]
                           ) -> dict[str, dict[int, list[float]]]:
    """worker -> in-flight count at send (capped at ``MAX_GROUP``) -> measured - predicted TTFT,
    over the requests that have both."""
    priced = [r for r in results if r.worker is not None and r.ttft_s is not None
              and r.router_ttft_s is not None and r.latency_s is not None]
    out: dict[str, dict[int, list[float]]] = {}
    for worker in sorted({r.worker for r in priced if r.worker is not None}):
        mine = [r for r in priced if r.worker == worker]
        groups = out.setdefault(worker, {})
        for r in mine:
            k = min(MAX_GROUP, in_flight_at_send(r, mine))
            groups.setdefault(k, []).append(r.ttft_s - r.router_ttft_s)  # type: ignore[operator]
    return out


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        if "requests_detail" not in run:
            continue
        results = [RequestResult(**r) for r in run["requests_detail"]]
        for worker, groups in residuals_by_in_flight(results).items():
            out.append({"contender": run["contender"], "workload": run["workload"],
                        "load": run["load"], "repeat": run.get("repeat", 1), "worker": worker,
                        "requests": sum(len(v) for v in groups.values()),
                        "median_residual_s": {k: statistics.median(v)
                                              for k, v in sorted(groups.items())},
                        "count": {k: len(v) for k, v in sorted(groups.items())}})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.ttft_residual",
                                description=__doc__.splitlines()[0])
    p.add_argument("--real", default=str(RESULTS / "pressure.json"))
    args = p.parse_args(argv)
    table = rows(json.loads(Path(args.real).read_text())["runs"])
    groups = " | ".join(f"{k}{'+' if k == MAX_GROUP else ''} in flight"
                        for k in range(MAX_GROUP + 1))
    print(f"| contender | point | rep | worker | requests | {groups} |")
    print("|---" * (5 + MAX_GROUP + 1) + "|")
    for r in table:
        cells = " | ".join(
            f"{r['median_residual_s'][k]:+.2f} s ({r['count'][k]})" if k in r["count"] else "-"
            for k in range(MAX_GROUP + 1))
        print(f"| {r['contender']} | {r['workload']} @ {r['load']} | {r['repeat']} | "
              f"{r['worker']} | {r['requests']} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
