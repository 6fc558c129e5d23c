"""The engine request ids the router gives requests (``rid``)."""

from __future__ import annotations

import secrets


class RequestIds:
    """Engine request ids nobody else can guess or claim (aborts and duplicates are keyed by
    them at the engine): 96 random bits each, not a counter a client could predict. The bits
    come from the OS in blocks: a ``getrandom`` call per request took 24 us of it under cProfile
    on this machine (``docs/benchmarks.md``, "Router overhead": within the rounds' spread)."""

    BLOCK = 12 * 512

    def __init__(self) -> None:
        self._bits = b""
        self._at = 0

    def new(self) -> str:
        if self._at + 12 > len(self._bits):
            self._bits, self._at = secrets.token_bytes(self.BLOCK), 0
        chunk = self._bits[self._at:self._at + 12]
        self._at += 12
        return f"rg-{chunk.hex()}"
