"""Index service costs: Match over gRPC vs in process, 1 vs 2 shards, snapshot write/restore.

Runs `radix-global index serve` as a real process on 127.0.0.1 (one per shard count), fills it
through Apply, then times blocking `IndexClient.match` calls. Bounded: --prompts x --pages ops,
--queries matches per configuration. Prints a table; writes benchmarks/results/index_service.json.

    python -m benchmarks.micro.index_service_bench [--prompts 2000 --pages 16 --queries 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.paths import REPO as ROOT
from radix_global.client import IndexClient
from radix_global.index import GlobalIndex
from radix_global.ops import IndexOp, StorePages
from radix_global.registration import WorkerInfo
from radix_global.snapshot import IndexSnapshot, encode_snapshot, read_snapshot, write_snapshot
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId

NS = Namespace("bench@1")


def _workload(prompts: int, pages: int, seed: int = 0) -> tuple[list[IndexOp], list[list[PageKey]]]:
    rng = random.Random(seed)
    chains = [[PageKey(rng.getrandbits(63)) for _ in range(pages)] for _ in range(prompts)]
    ops: list[IndexOp] = []
    for i, keys in enumerate(chains):
        loc = Location(WorkerId(f"w{i % 8}"), 0, Tier.GPU)
        ops.append(StorePages(NS, loc, None, keys))
    return ops, chains


def _pct(samples: list[float], q: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(q * len(samples)))]


def _serve(shards: int, snap: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "radix_global_cli", "index", "serve", "--port", "0",
         "--shards", str(shards), "--snapshot", snap, "--log-level", "WARNING"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "serving on" not in line:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError(f"index service did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[-1].strip()


def _bench_service(shards: int, ops: list[IndexOp], queries: list[list[PageKey]], snap: str
                   ) -> dict[str, float]:
    proc, target = _serve(shards, snap)
    try:
        with IndexClient(target, timeout_s=30) as client:
            client.register(WorkerInfo(worker_id="w0", url="http://127.0.0.1:1", model="bench",
                                       namespace=NS, page_size=16))
            t0 = time.perf_counter()
            for i in range(0, len(ops), 500):
                client.apply_many(ops[i : i + 500])
            fill_s = time.perf_counter() - t0
            lat = []
            for q in queries:
                t = time.perf_counter()
                client.match(NS, q)
                lat.append(time.perf_counter() - t)
            written = client.snapshot()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return {"fill_ops_per_s": len(ops) / fill_s, "match_p50_us": _pct(lat, 0.5) * 1e6,
            "match_p99_us": _pct(lat, 0.99) * 1e6, "match_mean_us": statistics.mean(lat) * 1e6,
            "snapshot_bytes": written.size_bytes, "snapshot_write_s": written.seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--pages", type=int, default=16)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/index_service.json"))
    args = ap.parse_args(argv)
    ops, chains = _workload(args.prompts, args.pages)
    rng = random.Random(1)
    queries = [rng.choice(chains)[: rng.randint(1, args.pages)] for _ in range(args.queries)]

    local = GlobalIndex()
    local.register_namespace(NS, 16)
    for op in ops:
        local.apply(op)
    lat = []
    for q in queries:
        t = time.perf_counter()
        local.match(NS, q, 1.0)
        lat.append(time.perf_counter() - t)
    rows: dict[str, dict[str, float]] = {
        "in-process": {"match_p50_us": _pct(lat, 0.5) * 1e6, "match_p99_us": _pct(lat, 0.99) * 1e6,
                       "match_mean_us": statistics.mean(lat) * 1e6}
    }
    with tempfile.TemporaryDirectory() as tmp:
        snap_path = Path(tmp) / "local.snap"
        t = time.perf_counter()
        write_snapshot(snap_path, encode_snapshot(IndexSnapshot(0.0, local.snapshot(), [])))
        rows["in-process"]["snapshot_write_s"] = time.perf_counter() - t
        t = time.perf_counter()
        GlobalIndex.restore(read_snapshot(snap_path).index)
        rows["in-process"]["restore_s"] = time.perf_counter() - t
        rows["in-process"]["snapshot_bytes"] = snap_path.stat().st_size
        for shards in (1, 2):
            rows[f"grpc {shards} shard(s)"] = _bench_service(shards, ops, queries,
                                                             str(Path(tmp) / f"s{shards}.snap"))

    cols = ["match_p50_us", "match_p99_us", "match_mean_us", "fill_ops_per_s", "snapshot_bytes",
            "snapshot_write_s", "restore_s"]
    print(f"index: {args.prompts} prompts x {args.pages} pages; {args.queries} matches")
    print(f"{'config':<20}" + "".join(f"{c:>18}" for c in cols))
    for name, row in rows.items():
        cells = "".join(f"{row[c]:>18.4g}" if c in row else f"{'-':>18}" for c in cols)
        print(f"{name:<20}{cells}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
