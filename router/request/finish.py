"""A request's outcome, booked in one place: the routing core's ``finished`` (exactly once per
routed attempt), the totals and the ``recent`` records of ``/admin/stats``."""

from __future__ import annotations

from typing import Any

from router.request.inbound import Inbound
from router.state import RouterState


def finish(state: RouterState, inbound: Inbound, ok: bool, tally: str,
           record: dict[str, Any]) -> None:
    """Close ``inbound``'s routed attempt: the cost model releases its queue estimate, and the
    outcome is counted under ``tally`` and recorded (``record``: what the relay knows of it)."""
    state.routing.finished(inbound.req.request_id, ok, state.clock())
    state.totals[tally] += 1
    remember(state, inbound, {"accepted": True, "ok": ok, **record})


def remember(state: RouterState, inbound: Inbound, record: dict[str, Any]) -> None:
    """One entry of ``recent``, with the router's and the client's request ids."""
    state.recent.append({"request_id": inbound.req.request_id,
                         "client_request_id": inbound.client_rid, **record})
