"""``make demo`` (``python -m benchmarks.scenarios.demo``): the cache-pressure scenario, short, on
this machine.

Builds the tiny model when missing, starts 2 CPU engines per contender with deliberately small
local caches (``benchmarks/data/pressure.toml``: 4,096 device + 8,192 host tokens each) and
replays 16 multi-turn conversations of the shipped trace sample
(``benchmarks/data/conversation_multiturn_sample.jsonl``) over 60 s against the strongest of
today's peer modes, smg 1.13 ``prefix_hash`` over stock SGLang sharing
SGLang's own ``file`` L3 tier, and our Conductor over workers with the L3 pool. Prints the
results table and one sentence on what it shows; writes ``benchmarks/results/demo.json`` and its
plots. Under 5 minutes on an idle 2-core
machine (engine start-ups are about half of it); extra arguments go to
``benchmarks.scenarios.pressure_bench``.
"""

from __future__ import annotations

import sys

from benchmarks.harness.paths import RESULTS
from benchmarks.scenarios import bench, pressure_bench


def main(argv: list[str] | None = None) -> int:
    extra = sys.argv[1:] if argv is None else argv
    out = RESULTS / "demo.json"
    return pressure_bench.main(["--quick", "--trace", str(bench.SAMPLE_TRACE), "--out", str(out),
                                *extra])


if __name__ == "__main__":
    sys.exit(main())
