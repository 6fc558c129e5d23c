"""Waiting on real servers: poll a condition until it holds, failing the test after a bound.

The bound is a wait, not a timing check (CI machines are shared); ``what`` says what never
happened, and may be a callable so that the message shows the state at the moment of failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def until(predicate: Callable[[], object], what: str | Callable[[], object],
          timeout_s: float = 30.0, every_s: float = 0.5) -> None:
    """Until ``predicate()`` is truthy; an AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(every_s)
