"""The route step of a request: the routing core's decision, as a worker to send to or as the
answer that refuses the request (429 with ``Retry-After``, or 503). The handler runs it first;
the relays run it again, with the workers that refused excluded, to retry."""

from __future__ import annotations

import math
from typing import NamedTuple

from starlette.responses import Response

from router.cluster.registry import WorkerEntry
from router.cluster.slots import worker_states
from router.request.finish import remember
from router.request.inbound import Inbound
from router.routing.admission import DECODE_KV, NO_WORKERS, TBT_SLO
from router.routing.contract import Decision
from router.state import RouterState
from router.transport.errors import ErrorType, error_response


class Routed(NamedTuple):
    decision: Decision
    entry: WorkerEntry

    def headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        """The decision as response headers (``docs/interfaces.md`` s. 17): where the request
        went, the prefix expected there, of it what is fetched from L3, the predicted queue and
        TTFT in whole milliseconds (no TTFT header for a policy that predicts none), and
        ``request_id``, the engine rid."""
        d = self.decision
        out = [(b"x-radix-worker", self.entry.info.worker_id.encode()),
               (b"x-radix-prefix-tokens", str(d.prefix_tokens).encode()),
               (b"x-radix-fetch-tokens", str(d.fetch_tokens).encode()),
               (b"x-radix-predicted-queue-ms", str(round(d.predicted_queue_s * 1000)).encode())]
        if d.predicted_ttft_s is not None:
            out.append((b"x-radix-predicted-ttft-ms",
                        str(round(d.predicted_ttft_s * 1000)).encode()))
        return [*out, (b"x-radix-request-id", request_id.encode())]


def route(state: RouterState, inbound: Inbound, excluded: set[str]) -> Routed | Response:
    clock, m, model = state.clock, state.metrics, inbound.model
    t = clock()
    slots = worker_states(state.registry.for_model(model), excluded)
    decision = state.routing.route(inbound.req, slots, clock())
    m.stage("policy").observe(clock() - t)
    outcome = "accepted" if decision.accepted else (decision.reason or "rejected")
    m.decision(model, outcome).inc()
    state.totals[f"decision_{outcome}"] += 1
    if not decision.accepted:
        if decision.reason in (DECODE_KV, TBT_SLO):  # PD admission: for the utilisation report
            state.pd_util.rejected_before_prefill += 1
        if decision.reason == NO_WORKERS:
            return error_response(503, f"no healthy worker for model {model!r}",
                                  ErrorType.UNAVAILABLE)
        retry = decision.retry_after_s if decision.retry_after_s is not None else 1.0
        remember(state, inbound, {"accepted": False, "reason": decision.reason,
                                  "retry_after_s": retry})
        return error_response(429, f"rejected by admission control: {decision.reason}",
                              ErrorType.RATE_LIMIT,
                              headers={"Retry-After": str(max(1, math.ceil(retry)))})
    entry = state.registry.find(decision.worker_id or "")
    if entry is None:  # decided, so recorded: released here, as nothing will run
        state.routing.finished(inbound.req.request_id, False, clock())
        return error_response(503, "the chosen worker left the pool", ErrorType.UNAVAILABLE)
    return Routed(decision, entry)
