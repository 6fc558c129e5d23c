"""A request's outcome, booked in one place: the routing core's ``finished`` (exactly once per
routed attempt), the totals and the ``recent`` records of ``/admin/stats``."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from router.request.inbound import Inbound
from router.state import RouterState


class Outcome(StrEnum):
    """How a routed attempt ended (the ``totals`` of ``/admin/stats``)."""

    OK = "ok"
    FAILED = "failed"
    PD_POOL_OK = "pd_pool_ok"
    PD_POOL_FAILED = "pd_pool_failed"


def finish(state: RouterState, inbound: Inbound, ok: bool, outcome: Outcome,
           record: dict[str, Any]) -> dict[str, Any]:
    """Close ``inbound``'s routed attempt: the cost model releases its queue estimate, and the
    outcome is counted and recorded (``record``: what the relay knows of it). Returns the record
    as kept, for numbers that arrive later (a native PD prefill half's)."""
    state.routing.finished(inbound.req.request_id, ok, state.clock())
    state.totals[outcome.value] += 1
    return remember(state, inbound, {"accepted": True, "ok": ok, **record})


def client_gone(state: RouterState) -> None:
    """The client disconnected before its answer was complete."""
    state.metrics.client_aborts.inc()
    state.totals["client_aborts"] += 1


def remember(state: RouterState, inbound: Inbound, record: dict[str, Any]) -> dict[str, Any]:
    """One entry of ``recent``, with the router's and the client's request ids."""
    kept = {"request_id": inbound.req.request_id, "client_request_id": inbound.client_rid,
            **record}
    state.recent.append(kept)
    return kept
