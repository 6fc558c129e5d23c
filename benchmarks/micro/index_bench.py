"""Global index benchmark: replay the Mooncake conversation trace onto simulated workers.

What it does
- Each trace request becomes a prompt (``radix_global.trace.synthesize_prompt``, 512 tokens per
  hash id) keyed with ``radix_global.keys.page_keys`` (page size 64: 8 pages per hash id). Key
  hashing is timed on its own, apart from matching.
- Workers: ``--workers`` engines, each with three LRU tiers fed write-through (as SGLang HiCache's
  write-through policy): GPU (``--worker-tokens``), HOST (``--host-factor`` x GPU), plus one shared
  L3 pool (``--pool-factor`` x GPU). A tier touches the prompt's pages deepest first, so a prefix
  is always more recent than its continuations and eviction is leaf first, as in SGLang. New pages
  become ``StorePages``, evictions ``RemovePages``.
- Routing policy: the worker with the longest GPU match; ties, or no match, go to the least loaded
  of them (fewest GPU pages held).
- Reported: key hashing time, match latency p50/p99, matches/s, pages applied/s, and resident
  memory (RSS from /proc) with index size, sampled every ``--sample-every`` requests.
- Baseline: SGLang's own ``RadixCache.match_prefix`` (one cache, page size 64, on CPU through
  ``sglang_patch.cpu_compat``) on the first ``--baseline-prompts`` prompts, against our index
  holding the same prompts for one worker.

Run: ``python -m benchmarks.micro.index_bench`` (short: 2,000 requests, 200k-token GPU tiers so that
evictions start) or ``--full`` (whole trace, 3M-token GPU tiers). JSON to
``benchmarks/results/index_bench.json`` (``--json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from array import array
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.harness.paths import FULL_TRACE, RESULTS
from radix_global import keys as page_keying
from radix_global.index import GlobalIndex
from radix_global.ops import IndexOp, RemovePages, StorePages
from radix_global.trace import read_trace, synthesize_prompt
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId

NS = Namespace("bench@1")
PAGE_SIZE = 64
TOKENS_PER_HASH_ID = 512
TRACE = FULL_TRACE
RESULT = RESULTS / "index_bench.json"


class LruTier:
    """One holder's tier: an LRU set of pages that emits the index ops its changes imply."""

    __slots__ = ("cap", "evicted", "loc", "pages")

    def __init__(self, loc: Location, cap_pages: int) -> None:
        self.loc = loc
        self.cap = cap_pages
        self.pages: OrderedDict[int, None] = OrderedDict()
        self.evicted = 0

    def held_run(self, prompt: list[PageKey]) -> int:
        n = 0
        for k in prompt:
            if k not in self.pages:
                break
            n += 1
        return n

    def admit(self, prompt: list[PageKey], ops: list[IndexOp]) -> None:
        held = self.held_run(prompt)
        pages = self.pages
        for k in reversed(prompt):  # deepest first: a prefix stays more recent than its tail
            pages[k] = None
            pages.move_to_end(k)
        if held < len(prompt):
            parent = prompt[held - 1] if held else None
            ops.append(StorePages(NS, self.loc, parent, prompt[held:]))
        if len(pages) > self.cap:
            gone = [pages.popitem(last=False)[0] for _ in range(len(pages) - self.cap)]
            self.evicted += len(gone)
            ops.append(RemovePages(NS, self.loc, [PageKey(k) for k in gone]))


class Worker:
    __slots__ = ("gpu", "host", "wid")

    def __init__(self, wid: WorkerId, gpu_pages: int, host_pages: int) -> None:
        self.wid = wid
        self.gpu = LruTier(Location(wid, 0, Tier.GPU), gpu_pages)
        self.host = LruTier(Location(wid, 0, Tier.HOST), host_pages)


cpu = time.thread_time


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def choose(workers: list[Worker], matched: dict[Any, Any]) -> Worker:
    """Longest GPU match; ties and no match -> least loaded (fewest GPU pages)."""
    best = max((m.gpu for m in matched.values()), default=0)
    pool = workers
    if best:
        ids = {h for (h, _), m in matched.items() if m.gpu == best}
        pool = [w for w in workers if w.wid in ids]
    return min(pool, key=lambda w: len(w.gpu.pages))


def index_heap_bytes(index: GlobalIndex) -> int:
    """Heap bytes of the index alone: a copy rebuilt under tracemalloc from its msgpack snapshot
    (decoded inside the trace, then dropped, so the copy's own key objects are counted)."""
    wire = msgspec.msgpack.encode(index.snapshot())
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        data = msgspec.msgpack.decode(wire)
        copy = GlobalIndex.restore(data)
        del data
        gc.collect()
        size = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del copy
    return size


def check_consistency(
    index: GlobalIndex, workers: list[Worker], pool: LruTier, prompts: deque[list[PageKey]]
) -> tuple[int, int]:
    """The index must agree with the simulated tiers: same distinct pages, and for recent
    prompts every holder's leading run per tier class equal to what its LRUs hold."""
    tiers = [t for w in workers for t in (w.gpu, w.host)] + [pool]
    errors = int(index.stats().pages != len(set().union(*(t.pages for t in tiers))))
    checked = 1
    for prompt in prompts:
        matched = index.match(NS, prompt, 0.0).matched
        for w in workers:
            gpu, host = w.gpu.held_run(prompt), w.host.held_run(prompt)
            m = matched.get((w.wid, 0))
            got = (m.gpu, m.host) if m else (0, 0)
            errors += got != (gpu, max(gpu, host))
            checked += 1
        m = matched.get((pool.loc.holder, 0))
        errors += (m.pool if m else 0) != pool.held_run(prompt)
        checked += 1
    return checked, errors


def replay(args: argparse.Namespace) -> tuple[dict[str, Any], list[array[int]]]:
    gpu_pages = args.worker_tokens // PAGE_SIZE
    workers = [
        Worker(WorkerId(f"w{i}"), gpu_pages, gpu_pages * args.host_factor)
        for i in range(args.workers)
    ]
    pool = LruTier(Location(PoolId("pool-0"), 0, Tier.POOL), gpu_pages * args.pool_factor)
    index = GlobalIndex()
    index.register_namespace(NS, PAGE_SIZE)
    hash_s = match_s = apply_s = 0.0
    match_us: list[float] = []
    match_wall_us: list[float] = []
    pages_applied = ops_applied = 0
    series: list[dict[str, Any]] = []
    kept_prompts: list[array[int]] = []
    recent: deque[list[PageKey]] = deque(maxlen=20)
    clock = 0.0
    n = prompt_pages = 0
    t_start = time.perf_counter()
    for n, req in enumerate(read_trace(args.trace, limit=args.limit), 1):
        tokens = synthesize_prompt(req.hash_ids, req.input_length, TOKENS_PER_HASH_ID)
        if len(kept_prompts) < args.baseline_prompts:
            kept_prompts.append(array("l", tokens))  # compact: a list of ints costs 36 B/token
        # CPU time of this thread (the machine is shared: wall time also counts other processes)
        t0 = cpu()
        prompt = page_keying.page_keys(tokens, PAGE_SIZE)
        t1 = cpu()
        prompt_pages += len(prompt)
        recent.append(prompt)
        clock = max(clock, req.timestamp_ms / 1000.0)
        w0 = time.perf_counter()
        result = index.match(NS, prompt, clock)
        w1 = time.perf_counter()
        t2 = cpu()
        hash_s += t1 - t0
        match_s += t2 - t1
        match_us.append((t2 - t1) * 1e6)
        match_wall_us.append((w1 - w0) * 1e6)
        worker = choose(workers, result.matched)
        ops: list[IndexOp] = []
        for tier in (worker.gpu, worker.host, pool):
            tier.admit(prompt, ops)
        t3 = cpu()
        for op in ops:
            index.apply(op)
        apply_s += cpu() - t3
        ops_applied += len(ops)
        for op in ops:
            pages_applied += len(op.keys)  # type: ignore[union-attr]
        if n % args.sample_every == 0:
            st = index.stats()
            evicted = sum(w.gpu.evicted + w.host.evicted for w in workers) + pool.evicted
            series.append(
                {
                    "requests": n,
                    "rss_mib": round(rss_mib(), 1),
                    "index_pages": st.pages,
                    "index_nodes": st.nodes,
                    "evicted_pages": evicted,
                    "index_mib": round(index.footprint_bytes() / 2**20, 1),
                }
            )
    stats = index.stats()
    checked, errors = check_consistency(index, workers, pool, recent)
    out = {
        "requests": n,
        "workers": args.workers,
        "worker_gpu_tokens": args.worker_tokens,
        "host_factor": args.host_factor,
        "pool_factor": args.pool_factor,
        "wall_s": round(time.perf_counter() - t_start, 2),
        "hash_us_per_prompt": round(hash_s / n * 1e6, 1),
        "mean_prompt_pages": round(prompt_pages / n, 1),
        "match_us_p50": round(pct(match_us, 0.50), 1),
        "match_us_p99": round(pct(match_us, 0.99), 1),
        "match_us_mean": round(match_s / n * 1e6, 1),
        "match_wall_us_p50": round(pct(match_wall_us, 0.50), 1),
        "match_wall_us_p99": round(pct(match_wall_us, 0.99), 1),
        "matches_per_s": round(n / match_s),
        "pages_applied": pages_applied,
        "ops_applied": ops_applied,
        "pages_applied_per_s": round(pages_applied / apply_s),
        "index_pages": stats.pages,
        "index_nodes": stats.nodes,
        "index_mib": round(index.footprint_bytes() / 2**20, 1),
        "index_heap_mib": round(index_heap_bytes(index) / 2**20, 1),
        "refused": stats.refused,
        "consistency_checked": checked,
        "consistency_errors": errors,
        "memory_series": series,
    }
    return out, kept_prompts


def sglang_baseline(packed: list[array[int]]) -> dict[str, Any]:
    """SGLang's RadixCache.match_prefix vs our index, one holder, on the same prompts."""
    try:
        from sglang_patch import cpu_compat

        cpu_compat.apply()
        t0 = time.perf_counter()
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    except Exception as exc:  # any import failure: report it, keep our own numbers
        print(f"!!! SGLang baseline SKIPPED: cannot import sglang on CPU: {exc!r}", file=sys.stderr)
        return {"skipped": repr(exc)}
    import_s = time.perf_counter() - t0
    prompts = [p.tolist() for p in packed]
    cache = RadixCache.create_simulated(page_size=PAGE_SIZE)
    for tokens in prompts:
        cache.insert(InsertParams(key=RadixKey(token_ids=tokens, extra_key=None)))
    sgl_us = []
    for tokens in prompts:
        t = cpu()
        cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=tokens, extra_key=None)))
        sgl_us.append((cpu() - t) * 1e6)
    index = GlobalIndex()
    index.register_namespace(NS, PAGE_SIZE)
    loc = Location(WorkerId("w0"), 0, Tier.GPU)
    keyed = [page_keying.page_keys(tokens, PAGE_SIZE) for tokens in prompts]
    for ks in keyed:
        if ks:
            index.apply(StorePages(NS, loc, None, ks))  # a known first key continues in place
    ours_us, hash_match_us = [], []
    for tokens, ks in zip(prompts, keyed, strict=True):
        t = cpu()
        index.match(NS, ks, 0.0)
        ours_us.append((cpu() - t) * 1e6)
        t = cpu()
        index.match(NS, page_keying.page_keys(tokens, PAGE_SIZE), 0.0)
        hash_match_us.append((cpu() - t) * 1e6)
    ours, sgl, both = (statistics.fmean(x) for x in (ours_us, sgl_us, hash_match_us))
    return {
        "prompts": len(prompts),
        "sglang_import_s": round(import_s, 1),
        "sglang_match_us_p50": round(pct(sgl_us, 0.5), 1),
        "sglang_match_us_p99": round(pct(sgl_us, 0.99), 1),
        "sglang_match_us_mean": round(sgl, 1),
        "ours_match_us_p50": round(pct(ours_us, 0.5), 1),
        "ours_match_us_p99": round(pct(ours_us, 0.99), 1),
        "ours_match_us_mean": round(ours, 1),
        "ours_hash_and_match_us_mean": round(both, 1),
        "ratio_ours_over_sglang": round(ours / sgl, 3),
        "ratio_ours_hash_and_match_over_sglang": round(both / sgl, 3),
    }


def print_report(res: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text when rich is missing
        for k, v in res.items():
            print(f"{k}: {v}")
        return
    console = Console()
    table = Table(title="global index: trace replay")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in res.items():
        if k not in ("memory_series", "baseline"):
            table.add_row(k, str(v))
    for k, v in res.get("baseline", {}).items():
        table.add_row(f"baseline.{k}", str(v))
    console.print(table)
    mem = Table(title="memory over time (RSS includes the simulated workers' LRUs)")
    cols = ("requests", "rss_mib", "index_pages", "index_nodes", "evicted_pages", "index_mib")
    for col in cols:
        mem.add_column(col, justify="right")
    for row in res["memory_series"]:
        mem.add_row(*(str(row[c]) for c in row))
    console.print(mem)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--limit", type=int, default=2000, help="requests to replay")
    ap.add_argument("--full", action="store_true", help="whole trace, 3M-token GPU tiers")
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--worker-tokens", type=int, default=200_000, help="GPU tier per worker")
    ap.add_argument("--host-factor", type=int, default=2)
    ap.add_argument("--pool-factor", type=int, default=16)
    ap.add_argument("--sample-every", type=int, default=0, help="default: limit / 10")
    ap.add_argument("--baseline-prompts", type=int, default=500, help="0 skips the baseline")
    ap.add_argument("--json", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    if args.full:
        args.limit, args.worker_tokens = None, 3_000_000
    if args.sample_every <= 0:
        args.sample_every = max(1, (args.limit or 12031) // 10)
    res, prompts = replay(args)
    res["command"] = " ".join(["python -m benchmarks.micro.index_bench", *(argv or sys.argv[1:])])
    res["baseline"] = sglang_baseline(prompts) if prompts else {"skipped": "--baseline-prompts 0"}
    print_report(res)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.json}")
    return res


if __name__ == "__main__":
    main()
