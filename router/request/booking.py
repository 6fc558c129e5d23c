"""The funnel and the SLOs of one closed request (``docs/interfaces.md``, "What the cache is
worth, live"), booked the same way whichever relay served it: the HTTP relay's attempt
(``router/request/attempt.py``) or the PD pool hand-off (``router/request/pool_relay.py``)."""

from __future__ import annotations

import logging
from typing import Any

from router.economics import reuse_of
from router.keying.prompt import engine_completion_tokens
from router.request.inbound import Inbound
from router.request.route import Routed
from router.state import RouterState

log = logging.getLogger("radix_global.router.request")


def book_answer(state: RouterState, inbound: Inbound, routed: Routed, answered: bool,
                cache_answer: Any, answer: Any, ttft_s: float | None,
                end_s: float | None, handoff: bool = False) -> None:
    """Book a request that ended (``answered``: an HTTP 200 answer, not a failure or an engine's
    refusal). ``cache_answer``: the answer of the worker the decision chose, whose cached
    tokens it predicted (a pool hand-off's prefill worker; else the same as ``answer``);
    ``answer``: what the client got (JSON or its last stream event: its completion tokens give
    the TBT); ``ttft_s`` / ``end_s``: its first and last bytes after the request arrived;
    ``handoff``: a PD pool hand-off, whose first byte the decision did not predict (the wait for
    the pool and the decode's first token come after the prefill it priced): no TTFT saved
    against the cold estimate is booked for it. Never raises: a failure is logged."""
    try:
        _book(state, inbound, routed, answered, cache_answer, answer, ttft_s, end_s, handoff)
    except Exception:  # a number an engine sent that we did not foresee: the request ends anyway
        log.exception("booking the answer of %s failed", inbound.req.request_id)


def _book(state: RouterState, inbound: Inbound, routed: Routed, answered: bool,
          cache_answer: Any, answer: Any, ttft_s: float | None, end_s: float | None,
          handoff: bool) -> None:
    d, req, stream = routed.decision, inbound.req, inbound.stream
    worker, n = routed.entry.worker_id, req.input_tokens
    # the funnel counts one prompt's tokens: a batch's engine numbers cover all of them
    if answered and n > 0 and inbound.batch is None:
        cost = state.routing.cost
        stream_ttft = ttft_s - routed.held_s \
            if ttft_s is not None and stream and not handoff else None
        state.economics.book(inbound.model, worker, reuse_of(
            d, n, cache_answer, stream_ttft, lambda prefix: cost.prefill_s(worker, n, prefix),
            cost.kv_bytes_per_token(req.namespace)), req.tenant)
    tbt_s = None
    tokens = engine_completion_tokens(answer)
    if stream and ttft_s is not None and end_s is not None and tokens and tokens > 1:
        tbt_s = (end_s - ttft_s) / (tokens - 1)
    slo = state.routing.slo
    state.admission.answered(inbound.model, d, answered, ttft_s if stream else None,
                             routed.held_s, slo.ttft_for(req), tbt_s, slo.tbt_for(req))
