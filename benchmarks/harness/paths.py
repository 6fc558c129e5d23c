"""Where the benchmarks read and write: paths in the source checkout (benchmarks are not in the
wheel), so that no module counts its own depth below the root."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "benchmarks" / "data"
RESULTS = REPO / "benchmarks" / "results"
BUILD = REPO / "build"
# The whole Mooncake conversation trace, beside the checkout (not committed; the samples are).
FULL_TRACE = REPO.parent / "shared" / "traces" / "conversation_trace.jsonl"
