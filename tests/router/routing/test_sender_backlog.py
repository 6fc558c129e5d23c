"""The bytes planned from each segment (router/routing/sender_backlog.py)."""

from __future__ import annotations

import pytest

from radix_global.types import PoolId, WorkerId
from router.routing.sender_backlog import SenderBacklog

A, B = PoolId("mc@10.0.0.1:1"), PoolId("mc@10.0.0.2:1")
W1, W2 = WorkerId("w1"), WorkerId("w2")


def test_booked_until_released_or_the_worker_leaves() -> None:
    s = SenderBacklog()
    s.book("r1", A, 0.1, W1)
    s.book("r2", A, 0.2, W2)
    s.book("r3", B, 5.0, W1)
    assert s.bytes_on(A) == 0.1 + 0.2 and s.bytes_on(B) == 5.0
    s.release("r1")
    s.release("r1")  # twice, or unknown: ignored
    s.release("nope")
    assert s.bytes_on(A) == pytest.approx(0.2)
    s.forget_worker(W1)
    assert s.bytes_on(B) == 0.0 and len(s) == 1
    s.release("r2")
    # an idle segment holds no float residue (0.1 + 0.2 - 0.1 - 0.2 is not 0.0)
    assert s.bytes_on(A) == 0.0 and not s._bytes and len(s) == 0


def test_a_request_booked_again_keeps_its_latest_fetch() -> None:
    s = SenderBacklog()
    s.book("r", A, 3.0, W1)
    s.book("r", B, 2.0, W1)
    assert (s.bytes_on(A), s.bytes_on(B)) == (0.0, 2.0)
    s.book("r", B, 0.0, W1)  # a re-route that fetches nothing
    assert s.bytes_on(B) == 0.0 and len(s) == 0
