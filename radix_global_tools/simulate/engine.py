"""The discrete-event engine: arrivals and prefill completions on a simulated clock.

Per arrival the real policy chooses a prefill instance through the real cost model, reading the
real global index; the simulated instance then serves the request FIFO with the calibrated prefill
time and, when the prefill completes, stores the prompt's pages in its local cache (and writes
them through to the pool), feeding the resulting ``StorePages``/``RemovePages`` to the index.

Modelling choices (also in docs/benchmarks.md):
- The engine always reuses its own local cache; it fetches from the pool only the pages the
  decision asked to fetch (Mooncake: the Conductor decides fetch vs recompute).
- Hits are taken at dispatch (the pages are touched then, so queueing cannot evict them).
- Pages become visible (local, pool, index) when the prefill that computed them completes.
- Without a decode side the prefill instance is released at prefill end (decode runs elsewhere),
  so the router's ``on_prefill_done`` and ``on_finished`` are both called then.
- With one (``radix_global_tools/simulate/decode.py``): PD, decode instances of their own that
  the router's decode selection picks (``router/routing/decode_select.py``, its KV reservations
  against each instance's KV capacity), the prompt's KV sent over the fabric layer by layer
  during the prefill (only what outlasts the prefill delays decoding); or co-located, each
  prefill instance decoding its own requests, a prefill stalling its batch and waiting for the
  step in progress. ``on_finished`` comes at the last token. TBT is a request's mean time
  between tokens: from its first token to its last, over its remaining tokens.
- Engine-reported ``waiting_tokens`` is left unknown: the router-side FIFO queue model is exact
  for a one-at-a-time server.
- Admission is booked in the router's own :class:`AdmissionLedger`, and each TTFT rejection is
  also priced as it would have gone (the best candidate's FIFO, cache and pool as they are at
  that moment): the truth the ledger's false-rejection estimate is checked against.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry

from radix_global.index import GlobalIndex
from radix_global.ops import IndexOp, IndexRefusal
from radix_global.types import Location, Namespace, PoolId, Role, Tier, WorkerId
from radix_global_tools.simulate.config import Calibration
from radix_global_tools.simulate.decode import Decoded, DecodeInstance
from radix_global_tools.simulate.instances import PageCache, PrefillInstance, local_location
from radix_global_tools.simulate.timed_policy import TimedPolicy
from radix_global_tools.simulate.workload import SimRequest, full_page_keys
from router.admission_ledger import AdmissionLedger
from router.routing.contract import (
    Decision,
    RejectReason,
    RouteRequest,
    RoutingPolicy,
    WorkerState,
)
from router.routing.cost import CostModel
from router.routing.decode_select import DecodeConfig, DecodeSelector
from router.routing.driver import PolicyDriver

NAMESPACE = Namespace("llama3-70b@sim")
MODEL = "llama3-70b"  # the admission ledger's label
POOL_ID = PoolId("pool-global")

# At equal times a completion is handled before an arrival, so the arrival sees its pages.
_DONE, _JOIN, _ARRIVAL = 0, 1, 2


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


class _InFlight(NamedTuple):
    req: SimRequest
    keys: tuple[Any, ...]
    instance: PrefillInstance
    prefill_s: float
    record: RequestRecord
    decision: Decision
    done_s: float  # its prefill ends


class _Service(NamedTuple):
    """How an instance would serve a request: cache and pool hits, fetch and prefill time."""

    local_pages: int
    fetched_pages: int
    reused_tokens: int
    fetch_s: float
    prefill_s: float


@dataclass
class ClusterSpec:
    """What one simulated run looks like (the policy object is built by the caller)."""

    instances: int
    calibration: Calibration
    local_tokens_per_instance: int
    with_pool: bool  # a global pool every instance can fetch from
    ttft_slo_s: float | None = None  # passed on each RouteRequest (None: policy default)
    decode_instances: int = 0  # PD: this many decode instances of their own
    colocated: bool = False  # without decode instances: each prefill instance decodes its own
    pool_tokens: int | None = None  # the pool's size (None: instances x the calibration's)
    extra: dict[str, Any] = field(default_factory=dict)


class Simulation:
    """One run: build with a spec, a policy and the router's cost model; ``run(requests)`` once.
    The router side is the production :class:`PolicyDriver` (policy + cost model + index)."""

    def __init__(self, spec: ClusterSpec, policy: RoutingPolicy, cost: CostModel) -> None:
        cal = spec.calibration
        self.spec, self.cal = spec, cal
        self.policy = TimedPolicy(policy)
        self.index = GlobalIndex()
        self.index.register_namespace(NAMESPACE, cal.page_tokens)
        pages = max(1, spec.local_tokens_per_instance // cal.page_tokens)
        self.instances = [
            PrefillInstance(
                WorkerId(f"p{i}"), PageCache(NAMESPACE, local_location(WorkerId(f"p{i}")), pages)
            )
            for i in range(spec.instances)
        ]
        self._by_id = {inst.worker_id: inst for inst in self.instances}
        self.pool: PageCache | None = None
        if spec.with_pool:
            pool_tokens = spec.pool_tokens if spec.pool_tokens is not None \
                else spec.instances * cal.pool_tokens_per_instance
            pool_pages = max(1, pool_tokens // cal.page_tokens)
            self.pool = PageCache(NAMESPACE, Location(POOL_ID, 0, Tier.POOL), pool_pages)
        prof = cal.decode
        self.pd = spec.decode_instances > 0
        decoder_ids = ([WorkerId(f"d{i}") for i in range(spec.decode_instances)] if self.pd
                       else [i.worker_id for i in self.instances] if spec.colocated else [])
        self.decoders = {w: DecodeInstance(prof) for w in decoder_ids}
        selector = DecodeSelector(DecodeConfig(tbt_base_s=prof.step_fixed_s,
                                               tbt_per_request_s=prof.step_per_request_s))
        if self.pd:  # what the HTTP router learns from a decode worker's /server_info
            selector.capacity.update(dict.fromkeys(decoder_ids, prof.kv_tokens_per_instance))
        self.driver = PolicyDriver(self.policy, cost, index=self.index, decode=selector)
        self._first_token: dict[str, tuple[float, int]] = {}  # (time, decode steps) per request
        self.tbt: dict[str, float] = {}
        self.records: list[RequestRecord] = []
        self.index_refusals: dict[str, int] = {}
        self.now = 0.0
        self.admission = AdmissionLedger(CollectorRegistry(), lambda: self.now,
                                         lambda: len(self.instances))
        # per TTFT rejection: whether it would have met its SLO (the counterfactual truth)
        self.rejections_would_meet: list[bool] = []

    def _worker_states(self, now: float) -> list[WorkerState]:
        pool_id = POOL_ID if self.pool is not None else None
        role = Role.PREFILL if self.pd else Role.MIXED
        states = [
            WorkerState(
                worker_id=inst.worker_id, namespace=NAMESPACE, pool_id=pool_id, role=role,
                running=inst.running(now), waiting=inst.waiting(now),
            )
            for inst in self.instances
        ]
        if self.pd:
            for wid, dec in self.decoders.items():
                self._decoded(dec.advance(now))
                states.append(WorkerState(worker_id=wid, namespace=NAMESPACE, role=Role.DECODE,
                                          running=dec.batch, waiting=dec.queued))
        return states

    def _apply(self, ops: Sequence[IndexOp]) -> None:
        for op in ops:
            try:
                self.index.apply(op)
            except IndexRefusal as exc:  # counted, never fatal: the run goes on
                self.index_refusals[exc.reason] = self.index_refusals.get(exc.reason, 0) + 1

    def run(self, requests: Sequence[SimRequest]) -> list[RequestRecord]:
        heap: list[tuple[float, int, int, Any]] = []
        for seq, req in enumerate(requests):
            heap.append((req.arrival_s, _ARRIVAL, seq, req))
        heapq.heapify(heap)
        seq = len(requests)
        while heap:
            now, kind, _, payload = heapq.heappop(heap)
            self.now = now
            if kind == _ARRIVAL:
                flight = self._arrive(payload, now)
                if flight is not None:
                    seq += 1
                    heapq.heappush(heap, (flight.done_s, _DONE, seq, flight))
            elif kind == _JOIN:
                target, rid, context, steps = payload
                self.decoders[target].join(now, rid, context, steps)
            else:
                join = self._complete(payload, now)
                if join is not None:
                    seq += 1
                    heapq.heappush(heap, (join[0], _JOIN, seq, join[1:]))
        for dec in self.decoders.values():
            self._decoded(dec.drain())
        self.records = [r._replace(tbt_s=self.tbt.get(r.request_id)) for r in self.records]
        return self.records

    def _decoded(self, done: Sequence[Decoded]) -> None:
        for d in done:
            first, steps = self._first_token.pop(d.request_id)
            self.tbt[d.request_id] = (d.finish_s - first) / steps if steps else 0.0
            self.driver.finished(d.request_id, True, min(d.finish_s, self.now))

    def _arrive(self, req: SimRequest, now: float) -> _InFlight | None:
        cal = self.cal
        keys = full_page_keys(req, cal.page_tokens)
        route = RouteRequest(
            request_id=req.request_id, namespace=NAMESPACE, input_tokens=req.input_tokens,
            page_keys=keys, page_size=cal.page_tokens, ttft_slo_s=self.spec.ttft_slo_s,
            output_tokens_hint=req.output_tokens,
        )
        workers = self._worker_states(now)
        decision = self.driver.route(route, workers, now)
        decision_s = self.policy.last_choose_s
        self.admission.decided(MODEL, decision, self.spec.ttft_slo_s)
        if decision.reason is RejectReason.TTFT_SLO and decision.candidates \
                and self.spec.ttft_slo_s is not None:
            self.rejections_would_meet.append(
                self._ttft_if_admitted(decision, keys, req, now) <= self.spec.ttft_slo_s)
        if not decision.accepted or decision.worker_id not in self._by_id:
            self.records.append(RequestRecord(
                req.request_id, now, False, None, req.input_tokens, 0, 0, 0.0, 0.0, 0.0, None,
                decision_s, decision.reason or "unknown_worker",
            ))
            return None
        inst = self._by_id[WorkerId(decision.worker_id)]
        s = self._service(inst, keys, req.input_tokens, decision.prefix_tokens,
                          decision.fetch_tokens, touch=True)
        # Co-located: the prefill waits for the decode step in progress, then stalls the batch.
        dec = None if self.pd else self.decoders.get(inst.worker_id)
        extra = dec.step_s() if dec is not None else 0.0
        start, finish = inst.enqueue(now, s.fetch_s + s.prefill_s + extra, req.input_tokens)
        if dec is not None:
            dec.stall(start, finish - start)
        record = RequestRecord(
            req.request_id, now, True, inst.worker_id, req.input_tokens,
            min(s.local_pages * cal.page_tokens, s.reused_tokens),
            s.fetched_pages * cal.page_tokens, start - now, s.fetch_s, s.prefill_s,
            finish + cal.first_token_s - now, decision_s,
        )
        return _InFlight(req, keys, inst, s.prefill_s, record, decision, finish)

    def _service(self, inst: PrefillInstance, keys: Sequence[Any], input_tokens: int,
                 prefix_tokens: int, fetch_tokens: int, touch: bool) -> _Service:
        """How ``inst`` serves a prompt the router planned ``prefix_tokens`` for (of them
        ``fetch_tokens`` from the pool); ``touch``: it does (the hits are taken now)."""
        cal = self.cal
        local = inst.cache.prefix_pages(keys)
        if touch:
            inst.cache.touch(keys[:local])
        fetched = 0
        if self.pool is not None and fetch_tokens > 0:
            in_pool = self.pool.prefix_pages(keys)
            if touch:
                self.pool.touch(keys[:in_pool])
            wanted = max(local, prefix_tokens // cal.page_tokens)
            fetched = max(0, min(in_pool, wanted) - local)
        # The last prompt token is always computed (its logits give the first output token).
        reused = min((local + fetched) * cal.page_tokens, max(0, input_tokens - 1))
        fetch_s = cal.fetch_s(fetched * cal.page_tokens)
        return _Service(local, fetched, reused, fetch_s, cal.prefill_s(input_tokens, reused))

    def _ttft_if_admitted(self, decision: Decision, keys: Sequence[Any], req: SimRequest,
                          now: float) -> float:
        """The TTFT a rejected request would have had on the candidate the policy priced best,
        served as an accepted one is, from the state of now."""
        best = min(decision.candidates, key=lambda c: c.ttft_s)
        inst = self._by_id[best.worker_id]
        s = self._service(inst, keys, req.input_tokens,
                          best.local_prefix_tokens + best.fetch_tokens, best.fetch_tokens,
                          touch=False)
        start = max(now, inst.busy_until)
        return start - now + s.fetch_s + s.prefill_s + self.cal.first_token_s

    def _complete(self, flight: _InFlight, now: float
                  ) -> tuple[float, WorkerId, str, int, int] | None:
        """The prefill ended: publish its pages; return when and where it joins a decode batch
        (with its context and decode steps), if the cluster has a decode side."""
        ops = flight.instance.cache.insert(flight.keys)
        if self.pool is not None:
            ops += self.pool.insert(flight.keys)
        self._apply(ops)
        req, rid = flight.req, flight.req.request_id
        self.driver.prefill_done(rid, now, prefill_s=flight.prefill_s)
        self.records.append(flight.record)
        self.admission.answered(MODEL, flight.decision, True, flight.record.ttft_s, 0.0,
                                self.spec.ttft_slo_s, None, None)
        if not self.decoders:
            self.driver.finished(rid, True, now)
            return None
        steps = max(0, req.output_tokens - 1)
        first = now + self.cal.first_token_s  # decoding goes on from the first token
        self._first_token[rid] = (first, steps)
        if self.pd and flight.decision.decode_worker_id is not None:
            target = WorkerId(flight.decision.decode_worker_id)
            ready = max(first, now + self.cal.handoff_s(req.input_tokens, flight.prefill_s))
        else:
            target, ready = flight.instance.worker_id, first
        return ready, target, rid, req.input_tokens, steps
