"""``make demo`` (``python -m benchmarks.demo``): the short side-by-side run on this machine.

Builds the tiny model when missing (``radix-global make-model build/tiny-llama``), starts 2 CPU
engines per contender kind, and replays the turns of 4 multi-turn conversations of the shipped
trace sample (``benchmarks/data/conversation_multiturn_sample.jsonl``) against the headline pair:
sglang-router ``cache_aware`` over stock SGLang vs our Conductor over workers with the L3 pool.
Prints the results table and the verdict; writes ``benchmarks/results/demo.json`` and
``demo_ttft_cdf.png``. About 4-5 minutes on an idle 2-core machine (measured 4 min 09 s; engine
start-ups dominate); extra arguments go to ``radix-global bench``.
"""

from __future__ import annotations

import sys

from benchmarks import bench


def main(argv: list[str] | None = None) -> int:
    extra = sys.argv[1:] if argv is None else argv
    out = bench.RESULTS / "demo.json"
    return bench.main(["--quick", "--trace", str(bench.SAMPLE_TRACE), "--out", str(out), *extra])


if __name__ == "__main__":
    sys.exit(main())
