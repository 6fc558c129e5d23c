"""The route step of a request: the routing core's decision, as a worker to send to, or the
refusal raised (:class:`HttpError`: 429 with ``Retry-After``, or 503). The handler runs it first,
after the request's wait at the dispatch gate when that is on (:func:`route_when_released`); the
relays run it again, with the workers that refused excluded, to retry."""

from __future__ import annotations

import asyncio
import math
from typing import NamedTuple

from starlette.types import Receive, Scope

from router.cluster.dispatcher import HeldQueueFull, HeldTooLong, Priced
from router.cluster.registry import WorkerEntry
from router.request.finish import client_gone, remember
from router.request.inbound import Inbound
from router.routing.admission import reject, ttft_excess
from router.routing.contract import Decision, RejectReason, RouteRequest
from router.state import RouterState
from router.transport.errors import ErrorType, HttpError
from router.transport.proxy import ClientGone, until_disconnect


class Routed(NamedTuple):
    decision: Decision
    entry: WorkerEntry
    held_s: float = 0.0  # at the dispatch gate, before it was routed

    def headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        """The decision as response headers (``docs/interfaces.md``, "The reuse breakdown"): where
        the request went, the prefix expected there, of it what is fetched from L3, the predicted
        queue and TTFT in whole milliseconds (no TTFT header for a policy that predicts none), the
        longest prefix held anywhere at the decision (no header for a policy that read no index),
        and ``request_id``, the engine rid."""
        d = self.decision
        out = [(b"x-radix-worker", self.entry.info.worker_id.encode()),
               (b"x-radix-prefix-tokens", str(d.prefix_tokens).encode()),
               (b"x-radix-fetch-tokens", str(d.fetch_tokens).encode()),
               (b"x-radix-predicted-queue-ms", str(round(d.predicted_queue_s * 1000)).encode())]
        if d.predicted_ttft_s is not None:
            out.append((b"x-radix-predicted-ttft-ms",
                        str(round(d.predicted_ttft_s * 1000)).encode()))
        if self.held_s > 0:
            out.append((b"x-radix-hold-ms", str(round(self.held_s * 1000)).encode()))
        if d.available_tokens is not None:
            out.append((b"x-radix-available-tokens", str(d.available_tokens).encode()))
        return [*out, (b"x-radix-request-id", request_id.encode())]


async def route_when_released(state: RouterState, inbound: Inbound, scope: Scope,
                              receive: Receive) -> Routed:
    """:func:`route`, after holding the request at the dispatch gate while the engines that
    could take it are busy (``docs/interfaces.md``,
    "Router-side dispatch: holding requests while the engines are busy"). Not held: dispatch off, a
    non-streaming request (no first token to see), or one the policy rejects now (refused at once).
    With a TTFT SLO, the predicted hold counts: a request that would miss it after waiting behind
    the held ones is refused now (429), as it would be without the gate. A full held queue is
    refused with 503 and Retry-After at once. A client that disconnects while held leaves the gate
    and is never routed (:class:`ClientGone` is raised; ``scope`` and ``receive``: its connection,
    the body already read)."""
    dispatcher, req = state.dispatcher, inbound.req
    if dispatcher is None or not inbound.stream:
        return route(state, inbound, set())
    estimated = _estimate(state, inbound)
    if estimated is None:
        return route(state, inbound, set())
    estimate, priced = estimated
    probe = False  # admitted as a probe: predicted to miss its SLO after the hold
    if estimate.predicted_ttft_s is not None:
        slo = state.routing.slo
        predicted = estimate.predicted_ttft_s + dispatcher.wait_s(inbound.model, priced.cost_s)
        excess = ttft_excess(req, predicted, slo)
        probe = excess is not None and slo.probes(req)
        if excess is not None and not probe:
            _answer(state, inbound, reject(req, estimate.policy, RejectReason.TTFT_SLO,
                                           slo.retry_after_s(excess), estimate.candidates,
                                           predicted))
    try:
        held_s = await until_disconnect(scope, receive, dispatcher.wait(
            req.request_id, inbound.model, priced, state.config.dispatch.timeout_s,
            reprice=lambda: _priced(state, inbound), size_bytes=len(inbound.raw)))
    except ClientGone:
        if dispatcher.gate.drop(req.request_id):  # released as it left: the room is free
            dispatcher.pump()
        client_gone(state)
        raise
    except HeldTooLong as exc:
        state.totals["held_too_long"] += 1
        raise HttpError(503, str(exc), ErrorType.UNAVAILABLE) from exc
    except HeldQueueFull as exc:
        state.totals["held_queue_full"] += 1
        raise HttpError(503, str(exc), ErrorType.UNAVAILABLE,
                        headers={"Retry-After": str(math.ceil(exc.retry_after_s))}) from exc
    if held_s > 0:  # placed against the cache of now, not of its arrival
        await prefetch_matches(state, req)
    try:
        routed = route(state, inbound, set())
    except HttpError:
        if dispatcher.gate.drop(req.request_id):
            dispatcher.pump()
        raise
    if probe:
        routed = routed._replace(decision=routed.decision._replace(probe=True))
    return routed._replace(held_s=held_s)


async def prefetch_matches(state: RouterState, req: RouteRequest) -> None:
    """With the index as a service, ask it for ``req``'s matches now: the policy's ``match``
    reads the answers and must not block the loop (``router/cluster/remote_index.py``)."""
    if state.index.remote:
        await asyncio.gather(*(state.index.prefetch_match(req.namespace, keys)
                               for keys in (req.page_keys, req.shared_keys) if keys))


def route(state: RouterState, inbound: Inbound, excluded: set[str]) -> Routed:
    """Where ``inbound`` goes, the workers of ``excluded`` aside; raises the refusal."""
    clock = state.clock
    t = clock()
    slots = state.slots.slots(inbound.model, excluded)
    decision = state.routing.route(inbound.req, slots, clock())
    state.metrics.stage("policy").observe(clock() - t)
    return _answer(state, inbound, decision, again=bool(excluded))


def _answer(state: RouterState, inbound: Inbound, decision: Decision, again: bool = False
            ) -> Routed:
    """A decision as the worker to send to; a rejection raised as the refusal. ``again``: the
    request's first worker refused it (admission booked the request then)."""
    clock, m, model = state.clock, state.metrics, inbound.model
    outcome = decision.outcome
    m.decision(model, outcome.value).inc()
    if not again:
        state.admission.decided(model, decision, state.routing.slo.ttft_for(inbound.req))
    state.totals[f"decision_{outcome.value}"] += 1
    if not decision.accepted:
        # PD admission, for the utilisation report
        if decision.reason in (RejectReason.DECODE_KV, RejectReason.TBT_SLO):
            state.pd_util.rejected_before_prefill += 1
        if decision.reason is RejectReason.NO_WORKERS:
            raise HttpError(503, f"no healthy worker for model {model!r}", ErrorType.UNAVAILABLE)
        retry = decision.retry_after_s if decision.retry_after_s is not None else 1.0
        remember(state, inbound, {"accepted": False, "reason": decision.reason,
                                  "retry_after_s": retry})
        raise HttpError(429, f"rejected by admission control: {decision.reason}",
                        ErrorType.RATE_LIMIT,
                        headers={"Retry-After": str(max(1, math.ceil(retry)))})
    entry = state.registry.find(decision.worker_id or "")
    if entry is None:  # decided, so recorded: released here, as nothing will run
        state.routing.finished(inbound.req.request_id, False, clock())
        raise HttpError(503, "the chosen worker left the pool", ErrorType.UNAVAILABLE)
    return Routed(decision, entry)


def _estimate(state: RouterState, inbound: Inbound) -> tuple[Decision, Priced] | None:
    """The policy's decision for ``inbound`` now, recorded nowhere, with its predicted work
    (prefill + fetch seconds, without queueing) and compute server; None when the policy would
    not place it."""
    req = inbound.req
    estimate = state.routing.estimate(
        req, state.slots.slots(inbound.model), state.clock())
    if not estimate.accepted or estimate.worker_id is None:
        return None
    prefill_s = (estimate.predicted_prefill_s if estimate.predicted_prefill_s is not None
                 else state.routing.cost.prefill_s(estimate.worker_id, req.input_tokens,
                                                   estimate.prefix_tokens))
    return estimate, Priced(prefill_s + estimate.predicted_transfer_s,
                            state.routing.cost.queue.server(estimate.slot))


def _priced(state: RouterState, inbound: Inbound) -> Priced | None:
    estimated = _estimate(state, inbound)
    return estimated[1] if estimated is not None else None
