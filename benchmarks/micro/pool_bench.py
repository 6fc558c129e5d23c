"""L3 shm pool bandwidth between TWO processes vs plain single-thread memcpy of the same bytes.

    python -m benchmarks.micro.pool_bench [--total-mib 256] [--repeats 3] [--out PATH]

Per page size: process W writes ``total/size`` random pages into a fresh pool (``put``, with the
xxh3 checksum), then process R reads them all (``get_into``, with lookup, generation check and
checksum verification) into its own buffers. In the same run, R also times ``numpy.copyto`` of the
same bytes from one private buffer to another (single thread): the memcpy ceiling. Reported:
median GB/s over repeats, and read/memcpy. Page sizes: 5 MiB = 16 tokens of LLaMA3-70B KV
(320 KiB/token), once as one contiguous chunk and once as 160 chunks (80 layers x K/V: SGLang's
layer-first host layout); 1 MiB; 64 KiB. Target: read >= 50% of memcpy for pages >= 1 MiB.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
import uuid
from typing import Any, NamedTuple

import numpy as np

from sglang_patch.pool.shm_pool import ShmPagePool, destroy_pool

MIB = 1 << 20
CASES = (("5 MiB (LLaMA3-70B, 16 tok)", 5 * MIB, 1), ("5 MiB in 160 chunks", 5 * MIB, 160),
         ("1 MiB", MIB, 1), ("64 KiB", 64 << 10, 1))


class Row(NamedTuple):
    case: str
    page_bytes: int
    chunks: int
    pages: int
    write_gbps: float
    read_gbps: float
    memcpy_gbps: float
    read_vs_memcpy: float


def _split(buf: np.ndarray, chunks: int) -> list[np.ndarray]:
    return list(np.split(buf, chunks)) if chunks > 1 else [buf]


def _writer(pool_id: str, page_bytes: int, chunks: int, pages: int, q: Any) -> None:
    pool = ShmPagePool(pool_id, page_bytes, pages * page_bytes)
    data = np.random.default_rng(0).integers(0, 256, page_bytes, dtype=np.uint8)
    bufs = []
    for i in range(pages):
        page = data.copy()
        page[:8] = np.frombuffer(i.to_bytes(8, "little"), np.uint8)
        bufs.append(_split(page, chunks))
    t0 = time.perf_counter()
    for i, parts in enumerate(bufs):
        assert pool.put(f"bench/{i}", parts, tag=i).new
    q.put(time.perf_counter() - t0)
    pool.close()


def _reader(pool_id: str, page_bytes: int, chunks: int, pages: int, q: Any) -> None:
    pool = ShmPagePool(pool_id, page_bytes, pages * page_bytes)
    dst = [_split(np.empty(page_bytes, np.uint8), chunks) for _ in range(pages)]
    for parts in dst:  # fault the destination pages in, as a warm host pool would be
        for p in parts:
            p.fill(0)
    t0 = time.perf_counter()
    for i, parts in enumerate(dst):
        assert pool.get_into(f"bench/{i}", parts)
    read_s = time.perf_counter() - t0
    src = [np.random.default_rng(i).integers(0, 256, page_bytes, dtype=np.uint8)
           for i in range(min(pages, 8))]
    copy_dst = [np.empty(page_bytes, np.uint8) for _ in range(pages)]
    for d in copy_dst:
        d.fill(0)
    t0 = time.perf_counter()
    for i in range(pages):
        np.copyto(copy_dst[i], src[i % len(src)])
    memcpy_s = time.perf_counter() - t0
    q.put((read_s, memcpy_s))
    pool.close()


def run_case(name: str, page_bytes: int, chunks: int, total: int, repeats: int) -> Row:
    pages = max(4, total // page_bytes)
    ctx = mp.get_context("spawn")
    writes, reads, copies = [], [], []
    for _ in range(repeats):
        pool_id = f"bench-{uuid.uuid4().hex[:8]}"
        try:
            q = ctx.Queue()
            for target in (_writer, _reader):  # one after the other: two processes, no overlap
                p = ctx.Process(target=target, args=(pool_id, page_bytes, chunks, pages, q))
                p.start()
                result = q.get(timeout=300)
                p.join(timeout=60)
                if target is _writer:
                    writes.append(result)
                else:
                    reads.append(result[0])
                    copies.append(result[1])
        finally:
            destroy_pool(pool_id)
    nbytes = pages * page_bytes
    w, r, c = (nbytes / statistics.median(x) / 1e9 for x in (writes, reads, copies))
    return Row(name, page_bytes, chunks, pages, round(w, 2), round(r, 2), round(c, 2),
               round(r / c, 3))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total-mib", type=int, default=256, help="bytes written per case")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/pool_bench.json")
    args = ap.parse_args(argv)
    rows = [run_case(name, size, chunks, args.total_mib * MIB, args.repeats)
            for name, size, chunks in CASES]
    header = f"{'case':<28}{'pages':>7}{'write GB/s':>12}{'read GB/s':>11}{'memcpy GB/s':>13}"
    print(header + f"{'read/memcpy':>13}")
    for row in rows:
        print(f"{row.case:<28}{row.pages:>7}{row.write_gbps:>12.2f}{row.read_gbps:>11.2f}"
              f"{row.memcpy_gbps:>13.2f}{row.read_vs_memcpy:>13.2f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    result = {"benchmark": "pool_bench", "total_mib": args.total_mib, "repeats": args.repeats,
              "cpus": os.cpu_count(), "statistic": "median over repeats",
              "target": "read >= 0.5 x memcpy for pages >= 1 MiB",
              "rows": [r._asdict() for r in rows]}
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
