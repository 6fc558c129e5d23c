"""Mooncake Store pool bandwidth between two test hosts vs memcpy, on unshaped and shaped links.

    python -m benchmarks.mooncake_bench [--total-mib 64] [--repeats 3] [--link-mbit 0 1000]

Hosts (``benchmarks/hosts.py``): ``m`` runs ``mooncake_master``, ``a`` a writer client, ``b`` a
reader client. Per link setting (0: unshaped; else ``tc tbf`` on a's and b's cables) and page
size, the writer on A ``put``s ``total/size`` pages (checksum, staging copy, into A's own
segment), then the reader on B ``get_into``s them all (over the link, checksum verified) and, in
the same process, times ``numpy.copyto`` of the same bytes: the memcpy ceiling. Reported: median
GB/s over repeats, with the spread (min-max), and read/memcpy. Each run uses fresh keys.
Results: table on stdout and JSON (``--out``); recorded in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

MIB = 1 << 20
CASES = (("5 MiB in 160 chunks", 5 * MIB, 160), ("1 MiB", MIB, 1), ("64 KiB", 64 << 10, 1))
REPO = Path(__file__).resolve().parent.parent


def _pool(master: str, host: str, page: int, segment: int) -> Any:
    from sglang_patch.pool.mooncake_pool import MooncakePagePool

    return MooncakePagePool("bench", page, master, host, segment)


def client(role: str, master: str, host: str, prefix: str, page: int, chunks: int,
           pages: int) -> dict[str, float]:
    """One side of a run, inside a test host: ``write`` keeps its segment (and the pages in
    it) alive until its stdin closes; ``read`` fetches them and times memcpy."""
    pool = _pool(master, host, page, max(64 * MIB, 2 * pages * (page + 4096)))
    data = np.random.default_rng(0).integers(0, 256, page, dtype=np.uint8)
    parts = list(np.split(data, chunks)) if chunks > 1 else [data]
    try:
        if role == "write":
            t0 = time.perf_counter()
            ok = sum(pool.put(f"{prefix}/{i}", parts, tag=i).stored for i in range(pages))
            print(json.dumps({"write_s": time.perf_counter() - t0, "stored": ok}), flush=True)
            sys.stdin.read()
            return {}
        dest = [np.empty_like(p) for p in parts]
        t0 = time.perf_counter()
        got = sum(pool.get_into(f"{prefix}/{i}", dest) for i in range(pages))
        read_s = time.perf_counter() - t0
        src, dst = np.ones(page, np.uint8), np.empty(page, np.uint8)
        t0 = time.perf_counter()
        for _ in range(pages):
            np.copyto(dst, src)
        out = {"read_s": read_s, "got": got, "memcpy_s": time.perf_counter() - t0}
        print(json.dumps(out), flush=True)
        return out
    finally:
        pool.close()


def _run_pair(hosts: Any, master: str, page: int, chunks: int, pages: int) -> dict[str, float]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def argv(role: str, host: str) -> list[str]:
        return hosts.argv(host, [sys.executable, "-m", "benchmarks.mooncake_bench", "--client",
                                 role, master, hosts[host].address, prefix, str(page),
                                 str(chunks), str(pages)])

    writer = subprocess.Popen(argv("write", "a"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert writer.stdout is not None and writer.stdin is not None
        wrote = json.loads(writer.stdout.readline())
        done = subprocess.run(argv("read", "b"), capture_output=True, text=True, env=env,
                              timeout=600, check=True)
        read = json.loads(done.stdout.strip().splitlines()[-1])
        if wrote["stored"] != pages or read["got"] != pages:
            raise RuntimeError(f"stored {wrote['stored']}, read {read['got']} of {pages}")
        writer.stdin.close()
        writer.wait(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
    size = pages * page / 1e9
    return {"write_gbps": size / wrote["write_s"], "read_gbps": size / read["read_s"],
            "memcpy_gbps": size / read["memcpy_s"]}


def median_spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def spread_text(v: dict[str, float], fmt: str) -> str:
    """A :func:`median_spread` as ``median (min-max)``."""
    return f"{v['median']:{fmt}} ({v['min']:{fmt}}-{v['max']:{fmt}})"


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--client"]:
        role, where, host, prefix, *sizes = args_in[1:8]
        client(role, where, host, prefix, *(int(x) for x in sizes))
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks.mooncake_bench")
    ap.add_argument("--total-mib", type=int, default=64, help="bytes moved per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--link-mbit", type=float, nargs="+", default=[0.0, 1000.0],
                    help="link settings: 0 = unshaped, else tc tbf on both hosts' cables")
    ap.add_argument("--out", default="benchmarks/results/mooncake_bench.json")
    args = ap.parse_args(args_in)
    from benchmarks.hosts import HostSet

    rows: list[dict[str, Any]] = []
    with HostSet(["m", "a", "b"], tempfile.mkdtemp(prefix="rg-mooncake-bench-")) as hosts:
        master = f"{hosts['m'].address}:50051"
        hosts.spawn("m", "master", [str(Path(sys.executable).parent / "mooncake_master"),
                                    "--rpc_port=50051", "--metrics_port=9003"])
        time.sleep(2.0)
        for mbit in args.link_mbit:
            for h in ("a", "b"):
                hosts.shape(h, mbit or None)
            for name, page, chunks in CASES:
                pages = max(1, args.total_mib * MIB // page)
                runs = [_run_pair(hosts, master, page, chunks, pages)
                        for _ in range(args.repeats)]
                row = {"link_mbit": mbit or None, "case": name, "page_bytes": page,
                       "chunks": chunks, "pages": pages,
                       **{k: median_spread([r[k] for r in runs])
                          for k in ("write_gbps", "read_gbps", "memcpy_gbps")}}
                row["read_vs_memcpy"] = row["read_gbps"]["median"] / row["memcpy_gbps"]["median"]
                rows.append(row)
                print(_line(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"total_mib": args.total_mib,
                                          "repeats": args.repeats, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


def _line(row: dict[str, Any]) -> str:
    def gb(key: str) -> str:
        return spread_text(row[key], ".2f")

    link = "unshaped" if row["link_mbit"] is None else f"{row['link_mbit']:.0f} Mbit/s"
    return (f"{link:<12} {row['case']:<22} write {gb('write_gbps')} GB/s  read "
            f"{gb('read_gbps')} GB/s  memcpy {gb('memcpy_gbps')} GB/s  "
            f"read/memcpy {row['read_vs_memcpy']:.1%}")


if __name__ == "__main__":
    sys.exit(main())
