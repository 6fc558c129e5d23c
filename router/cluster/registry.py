"""The worker registry: who serves which model, who may take new requests, who has gone away.

Pure bookkeeping (no I/O); the registration API (``router/http/admin.py``), the health monitor
(``router/cluster/health.py``) and the request path drive it. Rules from ``docs/interfaces.md``
section "Worker registration":

* the first worker of a namespace fixes its page size; a worker declaring another page size is
  refused (:class:`ConflictError` -> 409), as is a model already served under another namespace
  (a second model version must come under another model name, or after the old workers left), a
  pool id equal to a worker id, and a Mooncake segment pool id another worker registered (a
  segment is one worker's, and leaves the index with it: interfaces.md,
  "Mooncake Store as the L3 pool");
* a draining worker gets no new requests; a removed worker's index entries are dropped by the
  ``on_removed`` callback (the index owner does that);
* registered workers must heartbeat; command-line workers are health-checked over HTTP instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from radix_global.pool_ids import is_segment
from radix_global.registration import WorkerInfo
from radix_global.types import Namespace, WorkerId


class RegistryError(Exception):
    status = 400


class ConflictError(RegistryError):
    """Registration contradicts the cluster (page size, model namespace, id collision): 409."""

    status = 409


class UnknownWorkerError(RegistryError):
    status = 404


class Source(StrEnum):
    CLI = "cli"  # given on the router's command line: health-checked over HTTP
    REGISTERED = "registered"  # joined through POST /admin/workers: must heartbeat
    # admitted by another router sharing this one's view (router/coordination/): present while
    # its record is, which heartbeats anywhere keep alive; never expired here
    SHARED = "shared"


@dataclass
class WorkerEntry:
    """One worker as the router knows it. Mutable counters live here, the record is immutable."""

    info: WorkerInfo
    source: Source
    model_path: str | None = None  # tokenizer / chat template folder
    context_length: int | None = None
    draining: bool = False
    last_seen: float = 0.0
    health_failures: int = 0
    # Agreement tracking (router keys vs engine cache): router/http/admin.py diagnostics.
    routed: int = 0
    expected_hits: int = 0  # routed with a predicted local prefix > 0
    observed_hits: int = 0  # ... and the engine reported cached tokens > 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    failures: int = 0
    # LoRA adapters the engine reported (/server_info): name -> SGLang extra key
    # (router/keying/lora.py).
    lora: dict[str, str] = field(default_factory=dict)

    @property
    def worker_id(self) -> WorkerId:
        return WorkerId(self.info.worker_id)

    @property
    def accepting(self) -> bool:
        return not self.draining

    def to_json(self) -> dict[str, object]:
        i = self.info
        return {
            "worker_id": i.worker_id, "url": i.url, "model": i.model, "namespace": i.namespace,
            "page_size": i.page_size, "role": str(i.role), "dp_size": i.dp_size,
            "engine": i.engine, "pool_id": i.pool_id, "pool_aliases": i.pool_aliases,
            "pool_disk_id": i.pool_disk_id, "pool_disk_read_Bps": i.pool_disk_read_Bps,
            "pool_fetch_min_tokens": i.pool_fetch_min_tokens, "pool_load_Bps": i.pool_load_Bps,
            "pool_prefetch_budget_tokens": i.pool_prefetch_budget_tokens,
            "kv_events_endpoint": i.kv_events_endpoint, "place": i.place,
            "pool_capacity_bytes": i.pool_capacity_bytes,
            "source": str(self.source), "draining": self.draining, "last_seen": self.last_seen,
            "routed": self.routed, "failures": self.failures,
            "hit_rate": (self.cached_tokens / self.prompt_tokens) if self.prompt_tokens else None,
        }


Callback = Callable[[WorkerEntry], None]


class WorkerRegistry:
    """Workers by id; models and namespaces derived from them."""

    def __init__(self, on_added: Callback | None = None, on_removed: Callback | None = None):
        self._workers: dict[WorkerId, WorkerEntry] = {}
        self._page_size: dict[Namespace, int] = {}
        self._on_added = on_added
        self._on_removed = on_removed
        # counts the changes to who may be routed to (joined, left, drained, back): what is
        # built from the members (router/cluster/slots.py's tables) is rebuilt when it moves
        self.generation = 0

    # --- membership -------------------------------------------------------------------------

    def add(self, info: WorkerInfo, source: Source, now: float, *, model_path: str | None = None,
            context_length: int | None = None, lora: dict[str, str] | None = None
            ) -> WorkerEntry:
        """Add or replace ``info.worker_id``; raises :class:`ConflictError` on a contradiction."""
        ns = Namespace(info.namespace)
        fixed = self._page_size.get(ns)
        if fixed is not None and fixed != info.page_size:
            raise ConflictError(
                f"namespace {ns} has page size {fixed}; worker {info.worker_id} declares "
                f"{info.page_size} (router and engine would compute different page keys)")
        for other in self._workers.values():
            if other.info.worker_id == info.worker_id:
                continue
            if other.info.model == info.model and other.info.namespace != info.namespace:
                raise ConflictError(
                    f"model {info.model!r} is served as namespace {other.info.namespace}; "
                    f"worker {info.worker_id} declares {info.namespace}")
            if info.pool_id is not None and info.pool_id == other.info.worker_id:
                raise ConflictError(f"pool id {info.pool_id!r} equals a worker id")
            if other.info.pool_id is not None and other.info.pool_id == info.worker_id:
                raise ConflictError(f"worker id {info.worker_id!r} equals a pool id")
            if (info.pool_id is not None and is_segment(info.pool_id)
                    and other.info.pool_id == info.pool_id):
                # A Mooncake segment is one worker's client's memory (docs/interfaces.md,
                # "Mooncake Store as the L3 pool") and its entries leave the index with that worker:
                # a second worker naming it would take the first one's entries with it when it
                # leaves.
                raise ConflictError(
                    f"pool id {info.pool_id!r} is a Mooncake segment, which belongs to one "
                    f"worker, and worker {other.info.worker_id!r} registered it: give each "
                    "worker its own segment (its own advertised address and port)")
        old = self._workers.get(WorkerId(info.worker_id))
        if old is not None and old.info != info:
            self._drop(old)  # a changed record: forget what the index knew about the old one
        entry = WorkerEntry(info, source, model_path=model_path, context_length=context_length,
                            last_seen=now, lora=dict(lora or {}))
        if old is not None and old.info == info:
            entry = old
            entry.last_seen = now
            self.set_draining(info.worker_id, False)
            entry.model_path = model_path or entry.model_path
            entry.context_length = context_length or entry.context_length
            return entry
        had_page_size = ns in self._page_size
        self._page_size[ns] = info.page_size
        self._workers[entry.worker_id] = entry
        self.generation += 1
        if self._on_added is not None:
            try:
                self._on_added(entry)
            except Exception:
                # Refused by the index (a page-size conflict it knows of): not left half-added,
                # registered here and unknown there.
                self._workers.pop(entry.worker_id, None)
                if not had_page_size:
                    self._page_size.pop(ns, None)
                raise
        return entry

    def remove(self, worker_id: str) -> WorkerEntry:
        entry = self._workers.get(WorkerId(worker_id))
        if entry is None:
            raise UnknownWorkerError(f"unknown worker {worker_id!r}")
        self._drop(entry)
        return entry

    def _drop(self, entry: WorkerEntry) -> None:
        self._workers.pop(entry.worker_id, None)
        self.generation += 1
        if self._on_removed is not None:
            self._on_removed(entry)

    def drain(self, worker_id: str) -> WorkerEntry:
        return self.set_draining(worker_id, True)

    def set_draining(self, worker_id: str, draining: bool) -> WorkerEntry:
        """Take ``worker_id`` out of routing (``draining``) or put it back."""
        entry = self.get(worker_id)
        if entry.draining != draining:
            entry.draining = draining
            self.generation += 1
        return entry

    def heartbeat(self, worker_id: str, now: float) -> WorkerEntry:
        entry = self.get(worker_id)
        entry.last_seen = now
        return entry

    def expire(self, now: float, timeout_s: float) -> list[WorkerEntry]:
        """Remove registered workers silent for more than ``timeout_s``; returns them."""
        gone = [e for e in self._workers.values()
                if e.source is Source.REGISTERED and now - e.last_seen > timeout_s]
        for entry in gone:
            self._drop(entry)
        return gone

    # --- queries ----------------------------------------------------------------------------

    def get(self, worker_id: str) -> WorkerEntry:
        entry = self._workers.get(WorkerId(worker_id))
        if entry is None:
            raise UnknownWorkerError(f"unknown worker {worker_id!r}")
        return entry

    def find(self, worker_id: str) -> WorkerEntry | None:
        return self._workers.get(WorkerId(worker_id))

    def all(self) -> list[WorkerEntry]:
        return list(self._workers.values())

    def for_model(self, model: str) -> list[WorkerEntry]:
        return [e for e in self._workers.values() if e.info.model == model]

    def models(self) -> dict[str, Namespace]:
        return {e.info.model: Namespace(e.info.namespace) for e in self._workers.values()}

    def page_size(self, namespace: str) -> int | None:
        return self._page_size.get(Namespace(namespace))

    def __len__(self) -> int:
        return len(self._workers)


CONNECT_TIMEOUT = "connect_timeout"
CONNECT_REFUSED = "connect_refused"


class ConnectFailures:
    """Consecutive failures to connect to a worker on the request path, and when to evict it.

    A connect timeout is transient (a busy engine's full accept queue, a loaded host): the
    request is retried on another worker and the worker stays until ``timeouts_to_remove``
    consecutive connects failed. A refused connection means nothing listens there: evicted after
    ``refusals_to_remove`` consecutive refusals (default 1: at once, as before). Any mix of
    failures counts towards ``timeouts_to_remove``; a successful connect resets the streak.
    Pure bookkeeping; ``counts`` keeps the totals per kind.
    """

    def __init__(self, timeouts_to_remove: int = 3, refusals_to_remove: int = 1) -> None:
        if timeouts_to_remove < 1 or refusals_to_remove < 1:
            raise ValueError("need timeouts_to_remove >= 1 and refusals_to_remove >= 1")
        self.timeouts_to_remove = timeouts_to_remove
        self.refusals_to_remove = refusals_to_remove
        self._streak: dict[str, int] = {}  # worker -> consecutive failures of any kind
        self._refused: dict[str, int] = {}  # worker -> consecutive refusals
        self.counts: dict[str, int] = {CONNECT_TIMEOUT: 0, CONNECT_REFUSED: 0}
        self.evictions = 0

    def failed(self, worker_id: str, kind: str) -> bool:
        """Record one failed connect of ``kind``; True when the worker is to be evicted now
        (its streak is then cleared)."""
        if kind not in self.counts:
            raise ValueError(f"unknown connect failure kind {kind!r}")
        self.counts[kind] += 1
        streak = self._streak[worker_id] = self._streak.get(worker_id, 0) + 1
        refused = self._refused.get(worker_id, 0) + 1 if kind == CONNECT_REFUSED else 0
        self._refused[worker_id] = refused
        if streak >= self.timeouts_to_remove or refused >= self.refusals_to_remove:
            self.forget(worker_id)
            self.evictions += 1
            return True
        return False

    def succeeded(self, worker_id: str) -> None:
        if worker_id in self._streak:
            self.forget(worker_id)

    def forget(self, worker_id: str) -> None:
        self._streak.pop(worker_id, None)
        self._refused.pop(worker_id, None)

    def streak(self, worker_id: str) -> int:
        return self._streak.get(worker_id, 0)
