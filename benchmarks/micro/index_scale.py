"""The global index at cluster scale (issue 39): match latency, memory and the snapshot a
restarted router depends on, at 100k to 10M indexed pages, in minutes on one core.

A synthetic cluster state, built with the index's own ops: ``--workers`` workers; each prompt is
one of ``--prefixes`` shared prefixes (16 pages, a platform's system prompt) followed by 48 pages
of its own, stored on one worker's GPU tier and in the shared pool (``StorePages``), until the
index holds ``--pages`` distinct pages. Then, per size:

- build: pages applied per second (every op's pages, shared prefixes counted each time);
- memory: resident bytes per indexed page (RSS from /proc, after a collection) and the trees'
  own estimate (``GlobalIndex.footprint_bytes``);
- match: p50 / p99 over ``--matches`` lookups, half of stored prompts (a full hit), half of new
  ones behind a known prefix (a hit of 16 pages, then a miss);
- snapshot: ``snapshot()``, its JSON bytes (msgspec, as the router writes it), decode and
  ``GlobalIndex.restore`` times.

    python -m benchmarks.micro.index_scale --pages 100000 1000000 [10000000]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.harness.paths import RESULTS
from radix_global.index import GlobalIndex
from radix_global.ops import StorePages
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId

NS = Namespace("scale@1")
PAGE = 64
PREFIX_PAGES, OWN_PAGES = 16, 48
POOL = Location(PoolId("pool"), 0, Tier.POOL)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_size(pages: int, workers: int, prefixes: int, matches: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    shared = [[PageKey(rng.getrandbits(62)) for _ in range(PREFIX_PAGES)]
              for _ in range(prefixes)]
    locations = [Location(WorkerId(f"w{i}"), 0, Tier.GPU) for i in range(workers)]
    index = GlobalIndex()
    index.register_namespace(NS, PAGE)
    gc.collect()
    rss0 = rss_bytes()
    stored: list[list[PageKey]] = []
    applied, t_build = 0, 0.0
    while index.stats().pages < pages:
        keys = shared[len(stored) % prefixes] + [PageKey(rng.getrandbits(62))
                                                  for _ in range(OWN_PAGES)]
        ops = (StorePages(NS, locations[len(stored) % workers], None, keys),
               StorePages(NS, POOL, None, keys))
        t = time.perf_counter()
        for op in ops:
            index.apply(op)
        t_build += time.perf_counter() - t
        applied += 2 * len(keys)
        stored.append(keys)
    gc.collect()
    held = index.stats().pages
    per_page = (rss_bytes() - rss0) / held
    times = []
    for i in range(matches):
        keys = rng.choice(stored) if i % 2 else \
            rng.choice(shared) + [PageKey(rng.getrandbits(62)) for _ in range(OWN_PAGES)]
        t = time.perf_counter()
        index.match(NS, keys, 0.0)
        times.append(1e6 * (time.perf_counter() - t))
    t = time.perf_counter()
    snap = index.snapshot()
    t_snap = time.perf_counter() - t
    t = time.perf_counter()
    blob = msgspec.json.encode(snap)
    t_encode = time.perf_counter() - t
    del snap
    t = time.perf_counter()
    data = msgspec.json.decode(blob)
    t_decode = time.perf_counter() - t
    t = time.perf_counter()
    restored = GlobalIndex.restore(data)
    t_restore = time.perf_counter() - t
    if restored.stats().pages != held:
        raise RuntimeError(f"restore holds {restored.stats().pages} pages, not {held}")
    return {"pages": held, "prompts": len(stored), "workers": workers,
            "pages_applied_per_s": applied / t_build, "rss_bytes_per_page": per_page,
            "footprint_bytes_per_page": index.footprint_bytes() / held,
            "match_us_p50": _pct(times, 0.5), "match_us_p99": _pct(times, 0.99),
            "snapshot_s": t_snap, "snapshot_mib": len(blob) / 2**20, "encode_s": t_encode,
            "decode_s": t_decode, "restore_s": t_restore}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--workers", type=int, default=1024)
    ap.add_argument("--prefixes", type=int, default=64)
    ap.add_argument("--matches", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=RESULTS / "index_scale.json")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'pages':>10} {'applied/s':>11} {'B/page rss':>10} {'B/page est':>10} "
          f"{'match p50':>9} {'p99 us':>7} {'snap s':>7} {'MiB':>7} {'enc s':>6} {'dec s':>6} "
          f"{'restore s':>9}")
    for n in args.pages:
        r = one_size(n, args.workers, args.prefixes, args.matches, args.seed)
        rows.append(r)
        print(f"{r['pages']:>10} {r['pages_applied_per_s']:>11.0f} "
              f"{r['rss_bytes_per_page']:>10.0f} {r['footprint_bytes_per_page']:>10.0f} "
              f"{r['match_us_p50']:>9.1f} {r['match_us_p99']:>7.1f} {r['snapshot_s']:>7.2f} "
              f"{r['snapshot_mib']:>7.1f} {r['encode_s']:>6.2f} {r['decode_s']:>6.2f} "
              f"{r['restore_s']:>9.2f}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "index_scale", "rows": rows,
                                     "command": "python -m benchmarks.micro.index_scale " +
                                     " ".join(argv or [])}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
