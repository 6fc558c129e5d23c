"""Router hot path: time to key a prompt with ``radix_global.keys`` (pure Python + hashlib).

Prints a table and writes JSON. Run: ``python -m benchmarks.micro.bench_page_keys [--out FILE]
[--native]``; ``--native`` also times SGLang's C++ hash (``get_hash_str``, imports SGLang on CPU).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from radix_global import keys

CASES = [(4096, 64), (4096, 16), (4096, 1), (32768, 64)]


def _time_us(fn: object, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out", default="benchmarks/results/page_keys.json")
    ap.add_argument("--native", action="store_true", help="also time SGLang's native hash")
    args = ap.parse_args()
    native: Any = None
    if args.native:
        from sglang_patch import cpu_compat

        cpu_compat.apply()
        from sglang.srt.mem_cache.utils import get_hash_str

        native = get_hash_str

        native([1, 2], None, page_size=1)  # build/load the extension outside the timing
    rng = random.Random(0)
    rows = []
    for n_tokens, page_size in CASES:
        toks = [rng.randrange(0, 150_000) for _ in range(n_tokens)]
        reps = max(10, args.reps * 4096 // n_tokens // (1 if page_size > 1 else 8))
        samples = _time_us(lambda t=toks, p=page_size: keys.page_keys(t, p), reps)
        nat: float | None = None
        if native is not None:
            ns = _time_us(lambda t=toks, p=page_size: native(t, None, page_size=p), reps)
            nat = round(statistics.median(ns), 1)
        rows.append(
            {
                "sglang_native_median_us": nat,
                "tokens": n_tokens,
                "page_size": page_size,
                "pages": n_tokens // page_size,
                "reps": reps,
                "median_us": round(statistics.median(samples), 1),
                "p99_us": round(sorted(samples)[int(0.99 * (len(samples) - 1))], 1),
            }
        )
    print(f"{'tokens':>7} {'page':>5} {'pages':>6} {'median us':>10} {'p99 us':>9} {'native':>8}")
    for r in rows:
        print(
            f"{r['tokens']:>7} {r['page_size']:>5} {r['pages']:>6} "
            f"{r['median_us']:>10} {r['p99_us']:>9} {r['sglang_native_median_us'] or '-':>8}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "page_keys", "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
