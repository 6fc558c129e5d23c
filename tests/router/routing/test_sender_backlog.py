"""When each segment's link is next free (router/routing/sender_backlog.py)."""

from __future__ import annotations

import pytest

from radix_global.types import PoolId
from router.routing import sender_backlog
from router.routing.sender_backlog import SenderBacklog

A, B = PoolId("mc@10.0.0.1:1"), PoolId("mc@10.0.0.2:1")


def test_the_wait_drains_with_time_and_books_only_later_ends() -> None:
    s = SenderBacklog()
    assert s.wait_s(A, 0.0) == 0.0
    s.book(A, 0.0, 3.0)
    s.book(A, 0.0, 2.0)  # ends before the one already planned: the link is busy until 3 anyway
    assert s.wait_s(A, 1.0) == pytest.approx(2.0) and s.wait_s(B, 1.0) == 0.0
    assert s.wait_s(A, 5.0) == 0.0


def test_idle_segments_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sender_backlog, "PRUNE_AT", 3)
    s = SenderBacklog()
    for i in range(4):  # the fourth, booked at 2.5, forgets the links idle by then
        s.book(PoolId(f"mc@10.0.0.{i}:1"), 2.5, i + 1.0)
    assert len(s) == 2 and s.wait_s(PoolId("mc@10.0.0.3:1"), 0.0) == 4.0
