"""Counts for the fuzz suites (``test_fuzz_*.py``): inputs tried per target and their outcomes.

Outcomes: ``ok`` (accepted), ``refused`` (a clear, typed refusal or gRPC status), ``crash`` (an
untyped exception or an unexpected status), ``hang`` (an input that took longer than
``HANG_S``), ``loss`` (state changed by a refused input, or a valid input afterwards failed).
A test asserts that no input crashed, hung or lost state; the counts are written, one JSON line
per target, to the file named by ``RADIX_FUZZ_REPORT`` when it is set.

``RADIX_FUZZ_SCALE`` multiplies every target's ``max_examples`` (default 1: the bounded run of
``make test``; a longer exploration: ``RADIX_FUZZ_SCALE=20``).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

HANG_S = 5.0
OUTCOMES = ("ok", "refused", "crash", "hang", "loss")


def examples(n: int) -> int:
    return max(1, int(n * float(os.environ.get("RADIX_FUZZ_SCALE", "1"))))


class Tally:
    """One fuzz target's counts; :meth:`timed` counts an input as a hang when it is too slow."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.counts: Counter[str] = Counter()

    def add(self, outcome: str) -> None:
        assert outcome in OUTCOMES, outcome
        self.counts[outcome] += 1

    @contextmanager
    def timed(self) -> Iterator[None]:
        start = time.monotonic()
        yield
        if time.monotonic() - start > HANG_S:
            self.add("hang")

    def bad(self) -> int:
        return self.counts["crash"] + self.counts["hang"] + self.counts["loss"]

    def write(self) -> None:
        path = os.environ.get("RADIX_FUZZ_REPORT")
        if path:
            row = {"target": self.target, "tried": self.counts["ok"] + self.counts["refused"]
                   + self.counts["crash"] + self.counts["loss"],
                   **{k: self.counts[k] for k in OUTCOMES}}
            with open(path, "a") as fh:
                fh.write(json.dumps(row) + "\n")
