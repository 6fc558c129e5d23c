"""Mooncake Store pool bandwidth between two test hosts vs memcpy, on unshaped and shaped links.

    python -m benchmarks.micro.mooncake_bench [--total-mib 64] [--repeats 3] [--link-mbit 0 1000]
                                        [--modes single packed zero-copy]

Hosts (``radix_global_tools/cluster/hosts.py``): ``m`` runs ``mooncake_master``, ``a`` a writer
client, ``b`` a reader client. Per link setting (0: unshaped; else ``tc tbf`` on a's and b's cables)
and page size, the writer on A ``put``s ``total/size`` pages (checksum, staging copy, into A's own
segment), then the reader on B ``get_into``s them all (over the link, checksum verified) and, in
the same process, times ``numpy.copyto`` of the same bytes: the memcpy ceiling. Three modes, run
alternately in each repeat: ``single`` moves one page per call (``put`` / ``get_into``);
``packed`` and ``zero-copy`` are the storage backend's path, pages in one registered region moved
by ``put_many`` / ``get_many``: packed copies each page into a registered staging slot and moves
it as one transfer (``batch_put_from`` / ``batch_get_into``), zero-copy moves each chunk as a
transfer of its own (``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``), both
in calls of at most 256 transfers; ``zero-copy-no-lookup`` is zero-copy with the reader's
replica lookup (one ``batch_get_replica_desc`` a batch, for reads around a lost host) cut out,
to price it. Reported: median
GB/s over repeats, with the spread (min-max), and read/memcpy. Each run uses fresh keys.
Results: table on stdout and JSON (``--out``); recorded in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.paths import REPO
from benchmarks.harness.spread import median_spread, spread_text

MIB = 1 << 20
CASES = (("5 MiB in 160 chunks", 5 * MIB, 160), ("1 MiB", MIB, 1), ("64 KiB", 64 << 10, 1),
         ("64 KiB in 8 chunks", 64 << 10, 8))
MODES = ("single", "packed", "zero-copy", "zero-copy-no-lookup")


def _pool(master: str, host: str, page: int, segment: int, mode: str) -> Any:
    from sglang_patch.pool.mooncake_pool import MooncakePagePool

    # each mode forced, whatever the pool's own threshold would choose
    return MooncakePagePool("bench", page, master, host, segment,
                            zero_copy_min_chunk=0 if mode.startswith("zero-copy") else 1 << 62)


def _region(pool: Any, page: int, chunks: int, pages: int) -> list[list[np.ndarray]]:
    """``pages`` pages of ``chunks`` chunks inside one array registered with ``pool``."""
    mem = np.zeros(pages * page, dtype=np.uint8)
    pool.register_memory(mem)
    return [list(np.split(mem[i * page:(i + 1) * page], chunks)) for i in range(pages)]


def client(role: str, master: str, host: str, prefix: str, mode: str, page: int, chunks: int,
           pages: int) -> dict[str, float]:
    """One side of a run, inside a test host: ``write`` keeps its segment (and the pages in
    it) alive until its stdin closes; ``read`` fetches them and times memcpy."""
    from sglang_patch.pool.base import PageIO

    pool = _pool(master, host, page, max(64 * MIB, 2 * pages * (page + 4096)), mode)
    if mode.endswith("no-lookup"):  # what the replica lookup of each batch read costs
        pool._replicas = lambda keys: {}
    data = np.random.default_rng(0).integers(0, 256, page, dtype=np.uint8)
    parts = list(np.split(data, chunks)) if chunks > 1 else [data]
    batch = mode != "single"
    try:
        if role == "write":
            region = _region(pool, page, chunks, pages) if batch else []
            for views in region:
                for dst, src in zip(views, parts, strict=True):
                    dst[:] = src
            t0 = time.perf_counter()
            if batch:
                ok = sum(r.stored for r in pool.put_many(
                    [PageIO(f"{prefix}/{i}", region[i], i) for i in range(pages)]))
            else:
                ok = sum(pool.put(f"{prefix}/{i}", parts, tag=i).stored for i in range(pages))
            print(json.dumps({"write_s": time.perf_counter() - t0, "stored": ok}), flush=True)
            sys.stdin.read()
            return {}
        if batch:
            region = _region(pool, page, chunks, pages)
            t0 = time.perf_counter()
            got = sum(pool.get_many([PageIO(f"{prefix}/{i}", region[i]) for i in range(pages)]))
        else:
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


def _run_pair(hosts: Any, master: str, mode: str, page: int, chunks: int,
              pages: int) -> dict[str, float]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def argv(role: str, host: str) -> list[str]:
        return hosts.argv(host, [sys.executable, "-m", "benchmarks.micro.mooncake_bench",
                                 "--client", role, master, hosts[host].address, prefix, mode,
                                 str(page), str(chunks), str(pages)])

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


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--client"]:
        role, where, host, prefix, mode, *sizes = args_in[1:9]
        client(role, where, host, prefix, mode, *(int(x) for x in sizes))
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks.micro.mooncake_bench")
    ap.add_argument("--total-mib", type=int, default=64, help="bytes moved per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--link-mbit", type=float, nargs="+", default=[0.0, 1000.0],
                    help="link settings: 0 = unshaped, else tc tbf on both hosts' cables")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--cases", nargs="+", choices=[c[0] for c in CASES],
                    default=[c[0] for c in CASES])
    ap.add_argument("--out", default="benchmarks/results/mooncake_bench.json")
    args = ap.parse_args(args_in)
    from radix_global_tools.cluster.hosts import HostSet

    rows: list[dict[str, Any]] = []
    with HostSet(["m", "a", "b"], tempfile.mkdtemp(prefix="rg-mooncake-bench-")) as hosts:
        master = f"{hosts['m'].address}:50051"
        hosts.spawn("m", "master", [str(Path(sys.executable).parent / "mooncake_master"),
                                    "--rpc_port=50051", "--metrics_port=9003"])
        time.sleep(2.0)
        for mbit in args.link_mbit:
            for h in ("a", "b"):
                hosts.shape(h, mbit or None)
            for name, page, chunks in (c for c in CASES if c[0] in args.cases):
                pages = max(1, args.total_mib * MIB // page)
                runs: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
                for _ in range(args.repeats):  # the modes alternate: side by side in time
                    for mode in args.modes:
                        runs[mode].append(_run_pair(hosts, master, mode, page, chunks, pages))
                for mode, done in runs.items():
                    row = {"link_mbit": mbit or None, "case": name, "mode": mode,
                           "page_bytes": page, "chunks": chunks, "pages": pages,
                           **{k: median_spread([r[k] for r in done])
                              for k in ("write_gbps", "read_gbps", "memcpy_gbps")}}
                    row["read_vs_memcpy"] = (row["read_gbps"]["median"]
                                             / row["memcpy_gbps"]["median"])
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
    return (f"{link:<12} {row['case']:<22} {row['mode']:<7} write {gb('write_gbps')} GB/s  read "
            f"{gb('read_gbps')} GB/s  memcpy {gb('memcpy_gbps')} GB/s  "
            f"read/memcpy {row['read_vs_memcpy']:.1%}")


if __name__ == "__main__":
    sys.exit(main())
