"""The cost model the Conductor ranks candidates with: queue + prefill + KV transfer seconds.

- prefill: one :class:`router.routing.prefill_model.PrefillModel` per worker (workers may differ),
  created from ``prefill_prior`` on first use and refitted online from observed prefills;
- queue: :class:`router.routing.queue_model.QueueModel` (router-side FIFO reconstruction),
  blended with the engine-reported waiting tokens when the worker reports them (other routers'
  traffic), plus the delay the requests the slot already has add to a first token (their
  decode steps), learned per worker from measured TTFTs
  (:class:`router.routing.drag_model.DragModel`);
- transfer: tokens x KV bytes per token / bottleneck bandwidth from the pool to the worker
  (:class:`router.routing.topology.Topology`; a default bandwidth when the pair is not placed),
  and, once the worker's prefill is profiled, no faster than its engine loads a pool run
  (``WorkerInfo.pool_load_Bps``); from a Mooncake segment other than the worker's own, after
  the fetches this router already planned from that segment
  (:class:`router.routing.sender_backlog.SenderBacklog`).
  Bytes per token are per namespace, as its workers report them (``WorkerInfo.kv_bytes_per_token``,
  :meth:`CostModel.set_kv_bytes_per_token`), else ``CostConfig.kv_bytes_per_token``.

The live router's :class:`CostConfig` is ``RouterConfig.cost`` (its options are declared here, with
the one place their defaults are written).

Implements :class:`router.routing.contract.CostView`; the ``on_*`` methods are the learning side,
called by :class:`router.routing.driver.PolicyDriver`. Pure: time is always passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Annotated, Any

from radix_global.options import opt
from radix_global.pool_ids import is_store_segment, segment_host
from radix_global.types import Namespace, PoolId, WorkerId
from router.routing.contract import Decision, RouteRequest, Slot, WorkerState
from router.routing.drag_model import DragModel
from router.routing.prefill_model import PrefillModel
from router.routing.queue_model import PendingPrefill, QueueModel
from router.routing.sender_backlog import SenderBacklog
from router.routing.topology import Topology, TopologyError

LLAMA3_70B_KV_BYTES_PER_TOKEN = 320 * 1024  # 80 layers x 8 KV heads x 128 dims x 2 (K,V) x 2 B


@dataclass(frozen=True)
class CostConfig:
    """Cost model (router/routing/cost.py): queue + prefill + KV transfer seconds."""

    engine_queue_weight: Annotated[float, opt(
        "how far a longer engine-reported queue corrects the routers' estimate", ge=0, le=1)] = 0.5
    # A namespace whose workers did not say (set_kv_bytes_per_token) is priced at this.
    kv_bytes_per_token: Annotated[int, opt(
        "KV bytes per token of a namespace whose workers report none (default: LLaMA3-70B)",
        ge=1)] = LLAMA3_70B_KV_BYTES_PER_TOKEN
    default_bandwidth_Bps: Annotated[float, opt(
        "pool -> worker bandwidth where the topology says nothing", gt=0,
        name="default_bandwidth_bytes_per_s")] = 10e9
    # a host's link (a 10 Gbit/s NIC), which a fetch from another host's segment of a shared
    # store (radix_global/pool_ids.py) crosses at least
    remote_segment_bandwidth_Bps: Annotated[float, opt(
        "a host's link to its rack: what a fetch from another host's segment crosses "
        "(docs/interfaces.md, \"Where hosts are\")", gt=0,
        name="remote_segment_bandwidth_bytes_per_s")] = 1.25e9
    transfer_overhead_s: Annotated[float, opt("fixed cost of one pool fetch", ge=0)] = 0.0
    # Refit a worker whose model was installed (set_prefill_model: a profile, fitted or
    # inherited) on FIFO-inferred service times too; on a batching engine they include its
    # waiting, which the fit turns into seconds of fixed cost per queued request. A worker on the
    # prior always learns from them (it has nothing better).
    learn_from_inferred_prefill: Annotated[bool, opt(
        "refit profiled workers on FIFO-inferred prefill times too")] = False
    # Learn per worker what a first token takes beyond queue + transfer + prefill, against the
    # requests on its slot (DragModel); a residual weighs half after this many more; 0: off.
    drag_half_life: Annotated[float, opt(
        "learn what the requests a worker has add to a first token; a measured TTFT weighs "
        "half after this many more; 0 = off", ge=0)] = 64.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.engine_queue_weight <= 1.0:
            raise ValueError("engine_queue_weight must be in [0, 1]")
        if self.drag_half_life < 0:
            raise ValueError("drag_half_life must be >= 0 (0: off)")
        if min(self.kv_bytes_per_token, self.default_bandwidth_Bps,
               self.remote_segment_bandwidth_Bps) <= 0:
            raise ValueError("kv_bytes_per_token and the bandwidths must be > 0")


class CostModel:
    def __init__(
        self,
        config: CostConfig | None = None,
        topology: Topology | None = None,
        prefill_prior: Callable[[], PrefillModel] = PrefillModel,
    ) -> None:
        self.config = config or CostConfig()
        self.topology = topology
        self.queue = QueueModel()
        self.sending = SenderBacklog()
        self._prior = prefill_prior
        self._prefill: dict[WorkerId, PrefillModel] = {}
        self._measured_only: set[WorkerId] = set()  # not refitted on FIFO-inferred times
        self._kv_bytes: dict[str, float] = {}  # namespace -> as its workers report it
        self._holder_Bps: dict[str, float] = {}  # holder -> its reported read bandwidth
        self._load_Bps: dict[WorkerId, float] = {}  # worker -> its engine's measured load path
        self._installed: set[WorkerId] = set()  # prefill from a profile, not the prior
        self._drag: dict[WorkerId, DragModel] = {}
        # workers whose idle_queue_s changed, by the change count it last changed at, oldest
        # first (a reader walks back from the newest to the count it saw)
        self._idle_changed: dict[WorkerId, int] = {}
        self._idle_count = 0
        self._removed_at = 0  # the change count of the latest worker removal

    # --- CostView (read side) -------------------------------------------------------------
    def prefill_model(self, worker: WorkerId) -> PrefillModel:
        model = self._prefill.get(worker)
        if model is None:
            model = self._prefill[worker] = self._prior()
        return model

    def share_compute(self, worker: WorkerId, domain: str | None) -> None:
        """``worker`` shares its compute with the other workers of ``domain`` (queue model)."""
        self.queue.share_compute(worker, domain)

    def set_prefill_model(self, worker: WorkerId, model: PrefillModel,
                          learn_inferred: bool | None = None) -> None:
        """Replace ``worker``'s model (e.g. a profiled one). ``learn_inferred=False``: refit it
        only on measured prefill times, never on FIFO-inferred ones (which on a batching engine
        include its waiting and would undo the profile); None: ``learn_from_inferred_prefill``."""
        if model is not self._prefill.get(worker):  # the one it has (the prior) stays what it is
            self._installed.add(worker)
        self._prefill[worker] = model
        if learn_inferred is None:
            learn_inferred = self.config.learn_from_inferred_prefill
        if learn_inferred:
            self._measured_only.discard(worker)
        else:
            self._measured_only.add(worker)

    def prefill_s(self, worker: WorkerId, input_tokens: int, prefix_tokens: int) -> float:
        # The engine always computes at least the last token (it needs its logits).
        prefix = max(0, min(prefix_tokens, input_tokens - 1))
        model = self._prefill.get(worker) or self.prefill_model(worker)
        return model.predict(input_tokens, prefix)

    def queue_s(self, worker: WorkerState, now: float) -> float:
        """The wait before a request routed to ``worker`` now starts its prefill: the FIFO of
        prefills (with the other routers' and corrected by the engine's report), plus the drag
        of the requests it has."""
        slot = worker.slot
        fifo = self._fifo_s(worker, slot, now)
        drag = self._drag.get(slot[0])
        if drag is None:  # the common case, kept cheap: this runs for every slot of a decision
            return fifo
        return fifo + drag.predict(self.queue.outstanding(slot) + worker.peer_requests)

    def idle_queue_s(self, worker: WorkerId) -> float:
        # what queue_s adds up to with no FIFO, no peers' and no engine's queue: 0.0 + the drag
        drag = self._drag.get(worker)
        return 0.0 if drag is None else 0.0 + drag.predict(0)

    def idle_changes(self, since: int) -> tuple[int, list[WorkerId] | None]:
        if self._removed_at > since:
            return self._idle_count, None
        changed = []
        for worker in reversed(self._idle_changed):
            if self._idle_changed[worker] <= since:
                break
            changed.append(worker)
        return self._idle_count, changed

    def busy(self) -> tuple[Collection[Slot], Collection[WorkerId]]:
        return self.queue.busy()

    def _idle_change(self, worker: WorkerId) -> None:
        self._idle_count += 1
        self._idle_changed.pop(worker, None)
        self._idle_changed[worker] = self._idle_count

    def drag_s(self, slot: Slot, elsewhere: int = 0) -> float:
        """What the requests ``slot`` has (queued or decoding; ``elsewhere``: routed by other
        routers) add to a new request's first token, as learned from its worker's measured
        TTFTs (0 until it has enough, or when off)."""
        drag = self._drag.get(slot[0])
        return drag.predict(self.queue.outstanding(slot) + elsewhere) if drag is not None \
            else 0.0

    def _fifo_s(self, worker: WorkerState, slot: Slot, now: float) -> float:
        # Queued prompts are batched by the engine's scheduler: price other routers' and the
        # engine's queued tokens as one cold prefill of separate prompts (no attention across
        # them; their lengths are not known).
        routers = self.queue.queue_s(slot, now)
        if worker.peer_prefill_tokens > 0:
            routers += self.prefill_model(worker.worker_id).predict_separate(
                worker.peer_prefill_tokens)
        if not worker.waiting_tokens:  # unknown or none: the routers' view stands
            return routers
        engine = self.prefill_model(worker.worker_id).predict_separate(worker.waiting_tokens)
        # Only upwards: the engine sees what bypassed every router, but not what is on its way
        # to it (routed a moment ago), so a smaller report does not shorten the queue.
        return routers + self.config.engine_queue_weight * max(0.0, engine - routers)

    def transfer_s(self, pool: PoolId, worker: WorkerState, tokens: int,
                   now: float | None = None) -> float:
        if tokens <= 0:
            return 0.0
        nbytes = tokens * self.kv_bytes_per_token(worker.namespace)
        # the path's overhead is what its transfers measured besides their bytes
        bandwidth, overhead = self._on_path(pool, worker.worker_id) or (
            self._unplaced_Bps(pool, worker.pool_id), 0.0)
        # the segment's link sends what was planned from it first (one's own: no link)
        ahead = self.sending.wait_s(pool, now) if now is not None and pool != worker.pool_id \
            else 0.0
        # A measured load is weighed only against a measured prefill: against the prior curve
        # (a GPU's) a CPU engine's load would always lose to a recompute it cannot do that fast.
        if worker.worker_id in self._installed:
            bandwidth = min(bandwidth, self._load_Bps.get(worker.worker_id, bandwidth))
        return self.config.transfer_overhead_s + overhead + ahead + nbytes / bandwidth

    def bandwidth_Bps(self, pool: PoolId, worker: WorkerId,
                      own_pool: PoolId | None = None) -> float:
        """Pool -> worker: the topology's placement, else what the pool's holder reported (a
        disk tier's measured read bandwidth), else, for a segment of a shared store on another
        host than the worker's own segment (``own_pool``), the remote bandwidth, else the
        default (``docs/interfaces.md``, "Mooncake Store as the L3 pool")."""
        path = self._on_path(pool, worker)
        return path[0] if path is not None else self._unplaced_Bps(pool, own_pool)

    def _unplaced_Bps(self, pool: PoolId, own_pool: PoolId | None) -> float:
        reported = self._holder_Bps.get(pool)
        if reported is not None:
            return reported
        host, own = segment_host(pool), segment_host(own_pool) if own_pool else None
        if host is not None and own is not None and host != own:
            return self.config.remote_segment_bandwidth_Bps
        return self.config.default_bandwidth_Bps

    def _on_path(self, pool: PoolId, worker: WorkerId) -> tuple[float, float] | None:
        """(bandwidth, per-transfer overhead) of the topology's path from ``pool`` to
        ``worker``; None where it does not place both or has no path."""
        topo = self.topology
        if topo is None or not (topo.knows(pool) and topo.knows(worker)):
            return None
        try:
            return topo.link(pool, worker)
        except TopologyError:
            return None

    def set_holder_bandwidth(self, holder: PoolId, bandwidth_Bps: float) -> None:
        """``holder`` reads at ``bandwidth_Bps`` (``WorkerInfo.pool_disk_read_Bps``)."""
        if not bandwidth_Bps > 0:
            raise ValueError(f"bandwidth must be > 0, got {bandwidth_Bps}")
        self._holder_Bps[holder] = bandwidth_Bps

    def set_load_bandwidth(self, worker: WorkerId, bandwidth_Bps: float) -> None:
        """``worker``'s engine takes a pool run into its device pool at ``bandwidth_Bps``
        (``WorkerInfo.pool_load_Bps``): once its prefill model is installed (a profile,
        :meth:`set_prefill_model`), its fetches are priced at no faster, from any pool."""
        if not bandwidth_Bps > 0:
            raise ValueError(f"bandwidth must be > 0, got {bandwidth_Bps}")
        self._load_Bps[worker] = bandwidth_Bps

    def kv_bytes_per_token(self, namespace: Namespace) -> float:
        """What one token of ``namespace`` weighs on the wire: as its workers report it, else
        ``CostConfig.kv_bytes_per_token``."""
        return self._kv_bytes.get(namespace, self.config.kv_bytes_per_token)

    def set_kv_bytes_per_token(self, namespace: str, nbytes: float) -> None:
        """``namespace``'s workers report ``nbytes`` of KV per token (a joining worker's
        ``WorkerInfo.kv_bytes_per_token``; the latest report wins: one model, one figure)."""
        if nbytes <= 0:
            raise ValueError(f"kv bytes per token must be > 0, got {nbytes}")
        self._kv_bytes[namespace] = nbytes

    def outstanding(self, slot: Slot) -> int:
        return self.queue.outstanding(slot)

    def prefetch_reserved_tokens(self, slot: Slot, min_tokens: int) -> int:
        return self.queue.prefetch_reserved_tokens(slot, min_tokens)

    # --- learning side --------------------------------------------------------------------
    def on_routed(self, req: RouteRequest, decision: Decision, now: float,
                  own_pool: PoolId | None = None) -> None:
        """``decision`` was taken for ``req`` (``own_pool``: the chosen worker's pool)."""
        if not decision.accepted or decision.worker_id is None:
            return
        predicted = decision.predicted_prefill_s
        if predicted is None:
            predicted = self.prefill_s(decision.worker_id, req.input_tokens, decision.prefix_tokens)
        # A fetch delays this request's prefill start on that slot, so it occupies the queue too.
        # The wait and the slot's requests are what its measured TTFT is later compared against.
        slot = decision.slot
        pending = PendingPrefill(now, predicted, req.input_tokens, decision.prefix_tokens,
                                 decision.predicted_transfer_s, decision.fetch_tokens,
                                 self.queue.queue_s(slot, now), self.queue.outstanding(slot))
        self.queue.add(slot, req.request_id, pending)
        if decision.fetch_tokens <= 0:
            return
        if not decision.fetch_pieces:
            self._book_send(decision.fetch_from, own_pool, now, decision.predicted_transfer_s)
        for piece in decision.fetch_pieces:
            self._book_send(piece.holder, own_pool, now, piece.transfer_s)

    def _book_send(self, source: PoolId | None, own_pool: PoolId | None, now: float,
                   seconds: float) -> None:
        """A fetch from another worker's segment holds its link for ``seconds`` from ``now``."""
        if source is not None and source != own_pool and is_store_segment(source):
            self.sending.book(source, now, now + seconds)

    def on_prefill_done(self, request_id: str, now: float, prefill_s: float | None = None) -> None:
        """First token seen. ``prefill_s``: the measured prefill compute time if the caller has
        it (the simulator does); else, optionally, the FIFO-inferred service time is learned."""
        done = self.queue.prefill_done(request_id, now)
        if done is None:
            return
        measured = prefill_s
        worker = done.slot[0]
        if measured is None and worker not in self._measured_only:
            measured = done.inferred_s - done.pending.transfer_s
        if measured is not None:
            self.prefill_model(worker).observe(
                done.pending.input_tokens, done.pending.prefix_tokens, measured
            )
        half_life = self.config.drag_half_life
        if half_life > 0:
            p = done.pending
            drag = self._drag.get(worker)
            if drag is None:
                drag = self._drag[worker] = DragModel(half_life)
            idle = drag.predict(0)
            drag.observe(p.outstanding,
                         (now - p.routed_at) - (p.wait_s + p.transfer_s + p.predicted_s))
            if drag.predict(0) != idle:
                self._idle_change(worker)

    def on_finished(self, request_id: str, now: float) -> None:
        self.queue.finished(request_id)

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        self.queue.forget_worker(worker_id)
        self._prefill.pop(worker_id, None)
        self._measured_only.discard(worker_id)
        self._load_Bps.pop(worker_id, None)
        self._installed.discard(worker_id)
        self._drag.pop(worker_id, None)
        # its entry goes (a router that sees many workers come and go keeps none of them);
        # readers start over from idle_queue_s
        self._idle_changed.pop(worker_id, None)
        self._idle_count += 1
        self._removed_at = self._idle_count

    def stats(self) -> dict[str, Any]:
        """Per worker: observations, MAPE of prefill predictions, coefficients, and the drag
        fit (``docs/interfaces.md``, "Routing policies")."""
        out: dict[str, Any] = {
            worker: {"observations": m.observations, "mape": m.mape(), "coef": m.coef}
            for worker, m in self._prefill.items()
        }
        for worker, drag in self._drag.items():
            out.setdefault(worker, {})["drag"] = drag.fit()._asdict()
        return out
