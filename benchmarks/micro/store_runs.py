"""A store's run over its segments against the longest run in one segment, on the conversation
trace (issue 44; docs/interfaces.md, "Mooncake Store as the L3 pool": "The run a store holds
across its segments").

    python -m benchmarks.micro.store_runs [--limit 3000] [--load 2] [--pool-gib 1024 2326]
        [--prefill 10] [--decode 2] [--host-tokens 258048] [--gbit 70] [--out FILE]

The capacity planner's A800 plan (session 32: 10 prefill + 2 decode instances, 258,048 tokens of
own cache each, 70 Gbit/s) simulated with the pool as per-instance segments (each writer puts
only the pages the store lacks into its own segment, the engine loads the whole run the store
holds) and routed by the conductor twice: pricing a store's run over its segments
(``store_runs``, the default since session 33) and pricing each segment's own leading run (the
router before). The striped pool (no segments) beside them. Prints the hit rate (prompt tokens
reused), the shares meeting the TTFT and TBT SLOs (30 s, 0.1 s) and the fetches; JSON to
``--out``. Deterministic: a rerun prints the same table.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import FULL_TRACE, RESULTS
from radix_global_tools.plan.search import Targets, outcome, segmented_pool
from radix_global_tools.plan.sizing import Sizing
from radix_global_tools.simulate.config import DEFAULT_CONFIG, load_calibration
from radix_global_tools.simulate.experiments import PolicySetup, run_one
from radix_global_tools.simulate.workload import read_trace, scale_load

TARGETS = Targets(ttft_slo_s=30.0, tbt_slo_s=0.1, accept=0.99)
MODES = (("striped", None, True), ("segments, one segment's run", 0, False),
         ("segments, the store's run", 0, True))


def one(trace: list[Any], s: Sizing, store_runs: bool) -> dict[str, Any]:
    cal = replace(load_calibration(DEFAULT_CONFIG), bandwidth_bytes_per_s=s.bandwidth_Bps)
    setup = PolicySetup("conductor", True, {"store_runs": store_runs})
    _, sim = run_one(cal, trace, s.prefill, setup, s.host_tokens or 0,
                     pool_tokens=s.pool_tokens, decode_instances=s.decode, prefill_batch=2,
                     fault_domains=segmented_pool(s))
    o = outcome(s, sim.records, TARGETS)
    fetched = [r for r in sim.records if r.fetched_tokens]
    return {"hit_rate": o.hit_rate, "ttft_share": o.ttft_share, "tbt_share": o.tbt_share,
            "both_share": o.both_share, "p99_ttft_s": o.p99_ttft_s, "fetches": len(fetched),
            "fetched_tokens": sum(r.fetched_tokens for r in fetched)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro.store_runs",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=FULL_TRACE)
    p.add_argument("--limit", type=int, default=3000)
    p.add_argument("--load", type=float, default=2.0)
    p.add_argument("--pool-gib", type=float, nargs="+", default=[1024.0, 2326.0])
    p.add_argument("--prefill", type=int, default=10)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--host-tokens", type=int, default=258_048)
    p.add_argument("--gbit", type=float, default=70.0)
    p.add_argument("--out", default=str(RESULTS / "store_runs.json"))
    args = p.parse_args(argv)
    trace = scale_load(read_trace(args.trace, args.limit), args.load)
    kv = load_calibration(DEFAULT_CONFIG).kv_bytes_per_token
    rows = []
    print("| pool GiB | pool | hit rate | TTFT <= 30 s | TBT <= 0.1 s | both | fetches | "
          "fetched tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for gib in args.pool_gib:
        for label, copies, store_runs in MODES:
            s = Sizing(args.prefill, args.decode, int(gib * 2**30 / kv), args.gbit * 1e9 / 8,
                       host_tokens=args.host_tokens, copies=copies)
            r = {"pool_gib": gib, "pool": label, **one(trace, s, store_runs)}
            rows.append(r)
            print(f"| {gib:g} | {label} | {r['hit_rate']:.3f} | {r['ttft_share']:.3f} | "
                  f"{r['tbt_share']:.3f} | {r['both_share']:.3f} | {r['fetches']} | "
                  f"{r['fetched_tokens']:,} |", flush=True)
    Path(args.out).write_text(json.dumps({"command": "python -m benchmarks.micro.store_runs " +
                                          " ".join(sys.argv[1:] if argv is None else argv),
                                          "rows": rows}, indent=1))
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
