"""What a simulated run says of each request (``Simulation.run``'s result)."""

from __future__ import annotations

from typing import NamedTuple


class RequestRecord(NamedTuple):
    request_id: str
    arrival_s: float
    accepted: bool
    worker_id: str | None
    input_tokens: int
    local_tokens: int  # reused from the chosen instance's own cache
    fetched_tokens: int  # pulled from the pool
    queue_s: float
    fetch_s: float
    prefill_s: float
    ttft_s: float | None  # None when rejected
    decision_s: float  # wall clock of policy.choose
    reason: str = ""
    tbt_s: float | None = None  # mean time between tokens (None: no decode side, or rejected)
