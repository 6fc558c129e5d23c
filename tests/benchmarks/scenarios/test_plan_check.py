"""The real-engine plan check's scoring (pure): TTFT and mean TBT from a replay's requests."""

from __future__ import annotations

from benchmarks.scenarios.plan_check import share_meeting
from radix_global_tools.plan.search import Targets


def request(status: str = "ok", ttft: float | None = 0.5, latency: float | None = 1.5,
            output: int = 11) -> dict[str, object]:
    return {"status": status, "ttft_s": ttft, "latency_s": latency, "output_tokens": output}


def test_shares() -> None:
    targets = Targets(ttft_slo_s=1.0, tbt_slo_s=0.1, accept=0.9)
    shares = share_meeting([
        request(),  # TBT (1.5 - 0.5) / 10 = 0.1: meets both
        request(ttft=1.2, latency=2.0),  # TTFT misses, TBT 0.08 meets
        request(latency=3.0),  # TBT 0.25 misses
        request(status="failed", ttft=None, latency=None),  # meets neither
        request(output=1, latency=9.0),  # one token: no TBT to miss
    ], targets)
    assert shares == {"ttft_share": 3 / 5, "tbt_share": 3 / 5, "both_share": 2 / 5}
