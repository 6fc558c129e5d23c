"""The discrete-event engine: arrivals and prefill completions on a simulated clock.

Per arrival the real policy chooses a prefill instance through the real cost model, reading the
real global index; the simulated instance then serves the request FIFO with the calibrated prefill
time (up to ``ClusterSpec.prefill_batch`` waiting requests as one batch, as an SGLang engine
batches its queue) and, when the prefill completes, stores the prompt's pages in its local cache
(and writes them through to the pool), feeding the resulting ``StorePages``/``RemovePages`` to
the index.

Modelling choices (also in docs/benchmarks.md):
- The engine always reuses its own local cache; it fetches from the pool only the pages the
  decision asked to fetch (Mooncake: the Conductor decides fetch vs recompute), from the holder
  it chose (the pool, or the disk tier under it: ``shared_tiers.py``).
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
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry

from radix_global.index import GlobalIndex
from radix_global.ops import IndexOp, IndexRefusal
from radix_global.types import Namespace, PoolId, Role, WorkerId
from radix_global_tools.simulate.config import Calibration
from radix_global_tools.simulate.decode import Decoded, DecodeInstance
from radix_global_tools.simulate.instances import (
    PageCache,
    PrefillInstance,
    Waiting,
    local_location,
)
from radix_global_tools.simulate.records import RequestRecord
from radix_global_tools.simulate.segments import DomainEvent, DomainRounds, FaultDomains, Segments
from radix_global_tools.simulate.shared_tiers import SharedTiers
from radix_global_tools.simulate.timed_policy import TimedPolicy
from radix_global_tools.simulate.workload import SimRequest, full_page_keys
from router.admission_ledger import AdmissionLedger
from router.routing.contract import (
    Decision,
    FetchPiece,
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

# At equal times a completion is handled before an arrival, so the arrival sees its pages; a
# batch starts after the arrivals of its instant, so requests sent together are batched together.
_DONE, _JOIN, _ARRIVAL, _START, _ROUND = 0, 1, 2, 3, 4


class _Service(NamedTuple):
    """How an instance would serve a request: cache and pool hits, fetch and prefill time."""

    local_pages: int
    fetched_pages: int
    reused_tokens: int
    fetch_s: float
    prefill_s: float


class _Queued(NamedTuple):
    """An accepted request waiting at its instance, its hits already taken."""

    req: SimRequest
    keys: tuple[Any, ...]
    service: _Service
    decision: Decision
    decision_s: float
    arrival_s: float


class _InFlight(NamedTuple):
    req: SimRequest
    keys: tuple[Any, ...]
    instance: PrefillInstance[_Queued]
    prefill_s: float
    record: RequestRecord
    decision: Decision


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
    prefill_batch: int = 1  # the most requests an instance prefills together
    disk_tokens: int = 0  # a disk tier under the pool (with_pool only; the profile's [disk])
    # with_pool only: the pool as per-instance segments in fault domains (segments.py)
    fault_domains: FaultDomains | None = None
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
        self.instances: list[PrefillInstance[_Queued]] = [
            PrefillInstance(
                WorkerId(f"p{i}"), PageCache(NAMESPACE, local_location(WorkerId(f"p{i}")), pages),
                spec.prefill_batch, cal.fixed_s / cal.prefill_speedup,
            )
            for i in range(spec.instances)
        ]
        self._by_id = {inst.worker_id: inst for inst in self.instances}
        self.shared: SharedTiers | Segments | None = None
        self.rounds: DomainRounds | None = None
        if spec.with_pool:
            pool_tokens = spec.pool_tokens if spec.pool_tokens is not None \
                else spec.instances * cal.pool_tokens_per_instance
            if spec.fault_domains is not None:
                workers = [inst.worker_id for inst in self.instances]
                self.shared = Segments(NAMESPACE, cal, workers, pool_tokens // spec.instances)
                self.rounds = DomainRounds(spec.fault_domains, workers, self.shared, self.index,
                                           NAMESPACE)
            else:
                self.shared = SharedTiers(NAMESPACE, cal, pool_tokens, spec.disk_tokens)
            self.shared.price_on(cost)
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
        # co-located: KV of requests whose prefill started and that have not joined the batch
        self._joining = dict.fromkeys(self.decoders, 0) if not self.pd else {}
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
        shared, dead = self.shared, self.rounds.dead if self.rounds is not None else set()
        disk_id = shared.disk_id if shared is not None else None
        role = Role.PREFILL if self.pd else Role.MIXED
        states = [
            WorkerState(
                worker_id=inst.worker_id, namespace=NAMESPACE, role=role,
                pool_id=shared.pool_of(inst.worker_id) if shared is not None else None,
                pool_disk_id=disk_id, running=inst.running(now), waiting=inst.waiting(),
            )
            for inst in self.instances if inst.worker_id not in dead
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
        if self.rounds is not None:
            last = max((r.arrival_s for r in requests), default=0.0)
            events = self.rounds.times(last)  # in order: at one instant too (seq breaks ties)
            heap += [(t, _ROUND, i - len(events), event) for i, (t, event) in enumerate(events)]
        heapq.heapify(heap)
        seq = len(requests)
        while heap:
            now, kind, _, payload = heapq.heappop(heap)
            self.now = now
            if kind == _ARRIVAL:
                due = self._arrive(payload, now)
                if due is not None:
                    seq += 1
                    heapq.heappush(heap, (due[0], _START, seq, due[1]))
            elif kind == _START:
                finish, flights, next_start = self._start(payload, now)
                for flight in flights:
                    seq += 1
                    heapq.heappush(heap, (finish, _DONE, seq, flight))
                if next_start is not None:
                    seq += 1
                    heapq.heappush(heap, (next_start, _START, seq, payload))
            elif kind == _ROUND:
                self._round(payload, now)
            elif kind == _JOIN:
                target, rid, context, steps = payload
                if not self.pd:
                    self._joining[target] -= context + steps
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

    def _round(self, event: DomainEvent, now: float) -> None:
        """A copy round, or a fault domain failing or coming back (fault_domains only)."""
        assert self.rounds is not None
        if event is DomainEvent.FAIL:
            self.rounds.fail()
        elif event is DomainEvent.BACK:
            for worker in self.rounds.back():  # a restarted engine: its own cache is empty
                inst = self._by_id[worker]
                inst.cache = PageCache(NAMESPACE, inst.cache.location, inst.cache.capacity_pages)
        else:
            self._apply(self.rounds.copy_round(now))

    def _decoded(self, done: Sequence[Decoded]) -> None:
        for d in done:
            first, steps = self._first_token.pop(d.request_id)
            self.tbt[d.request_id] = (d.finish_s - first) / steps if steps else 0.0
            self.driver.finished(d.request_id, True, min(d.finish_s, self.now))

    def _arrive(self, req: SimRequest, now: float
                ) -> tuple[float, PrefillInstance[_Queued]] | None:
        """Route ``req``; if accepted, queue it and return when and where a batch start is due
        (None: rejected, or a start is already scheduled there)."""
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
                          decision.fetch_tokens, decision.fetch_from, touch=True, now=now,
                          pieces=decision.fetch_pieces)
        queued = _Queued(req, keys, s, decision, decision_s, now)
        kv = req.input_tokens + max(0, req.output_tokens - 1)
        due = inst.enqueue(now, Waiting(s.fetch_s + s.prefill_s, req.input_tokens, queued, kv))
        return None if due is None else (due, inst)

    def _start(self, inst: PrefillInstance[_Queued], now: float
               ) -> tuple[float, list[_InFlight], float | None]:
        """A batch is due at ``inst``: when it ends, its members, and when the next start is due.
        Co-located, the batch needs room in the instance's KV (running requests keep theirs, as
        an SGLang engine admits a prefill only into free KV): while there is none it waits a
        decode step and asks again; then it waits for the step in progress and stalls decoding."""
        dec = None if self.pd else self.decoders.get(inst.worker_id)
        kv_free = math.inf
        if dec is not None:
            self._decoded(dec.advance(now))
            kv_free = (dec.profile.kv_tokens_per_instance - dec.kv_promised_tokens
                       - self._joining[inst.worker_id])
            busy = dec.batch > 0 or self._joining[inst.worker_id] > 0
            if busy and inst.head_kv_tokens() > kv_free:
                return now, [], now + max(dec.step_s(), self.cal.first_token_s)
            now += dec.step_s()
        batch, next_start = inst.start(now, kv_free)
        if dec is not None:
            dec.stall(batch.start_s, batch.finish_s - batch.start_s)
            self._joining[inst.worker_id] += sum(w.kv_tokens for w in batch.members)
        cal, flights = self.cal, []
        for w in batch.members:
            q, s = w.payload, w.payload.service
            record = RequestRecord(
                q.req.request_id, q.arrival_s, True, inst.worker_id, q.req.input_tokens,
                min(s.local_pages * cal.page_tokens, s.reused_tokens),
                s.fetched_pages * cal.page_tokens, batch.start_s - q.arrival_s, s.fetch_s,
                s.prefill_s, batch.finish_s + cal.first_token_s - q.arrival_s, q.decision_s,
            )
            flights.append(_InFlight(q.req, q.keys, inst, s.prefill_s, record, q.decision))
        return batch.finish_s, flights, next_start

    def _service(self, inst: PrefillInstance[_Queued], keys: Sequence[Any], input_tokens: int,
                 prefix_tokens: int, fetch_tokens: int, fetch_from: PoolId | None,
                 touch: bool, now: float = 0.0, pieces: Sequence[FetchPiece] = ()) -> _Service:
        """How ``inst`` serves a prompt the router planned ``prefix_tokens`` for (of them
        ``fetch_tokens`` from ``fetch_from``, or from each of ``pieces``' segments); ``touch``:
        it does (the hits are taken now)."""
        cal = self.cal
        local = inst.cache.prefix_pages(keys)
        if touch:
            inst.cache.touch(keys[:local])
        fetched, fetch_s = 0, 0.0
        if self.shared is not None and fetch_tokens > 0:
            wanted = max(local, prefix_tokens // cal.page_tokens)
            fetched, fetch_s = self.shared.fetch(keys, local, wanted, fetch_from, touch, now,
                                                 inst.worker_id, pieces)
        # The last prompt token is always computed (its logits give the first output token).
        reused = min((local + fetched) * cal.page_tokens, max(0, input_tokens - 1))
        return _Service(local, fetched, reused, fetch_s, cal.prefill_s(input_tokens, reused))

    def _ttft_if_admitted(self, decision: Decision, keys: Sequence[Any], req: SimRequest,
                          now: float) -> float:
        """The TTFT a rejected request would have had on the candidate the policy priced best,
        served as an accepted one is, from the state of now."""
        best = min(decision.candidates, key=lambda c: c.ttft_s)
        inst = self._by_id[best.worker_id]
        s = self._service(inst, keys, req.input_tokens,
                          best.local_prefix_tokens + best.fetch_tokens, best.fetch_tokens,
                          best.fetch_from, touch=False, now=now, pieces=best.fetch_pieces)
        return inst.free_at(now) - now + s.fetch_s + s.prefill_s + self.cal.first_token_s

    def _complete(self, flight: _InFlight, now: float
                  ) -> tuple[float, WorkerId, str, int, int] | None:
        """The prefill ended: publish its pages; return when and where it joins a decode batch
        (with its context and decode steps), if the cluster has a decode side."""
        writer = flight.instance.worker_id
        if self.rounds is None or writer not in self.rounds.dead:  # else: lost with its host
            ops = flight.instance.cache.insert(flight.keys)
            if self.shared is not None:
                ops += self.shared.store(flight.keys, writer)
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
