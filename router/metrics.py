"""Prometheus metrics of the router, in a registry of their own (one per app instance).

Names follow Prometheus conventions under the project prefix ``radix_global_`` (units in the
name, counters exposed as ``_total``; the renames are in ``CHANGELOG.md``). Per request the
router records its decision (accepted/rejected and why), the tokens and KV bytes it planned to
fetch and the predicted transfer time, predicted vs observed TTFT and the time spent in each
router stage. ``radix_global_key_mismatch`` flags a worker whose engine never reports a hit
where the router predicted one (router/engine disagreement).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                    10, 30, 60)


class Children:
    """Labelled children looked up once per label tuple (``labels()`` costs a lock and a dict
    on every call): ``children(metric, *labels)``. Only for metrics that are never cleared."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], Any] = {}

    def __call__(self, metric: Any, *labels: Any) -> Any:
        key = (id(metric), *labels)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = metric.labels(*map(str, labels))
        return child


class WorkerMetrics(NamedTuple):
    """One worker's labelled children, looked up once (``labels()`` costs a lock and a dict)."""

    routed: Any
    outstanding: Any
    fetch_tokens: Any
    fetch_bytes: Any
    relayed_bytes: Any
    actual_ttft: Any


class RouterMetrics:
    """The router's metrics (``radix_global_*``; what the cache was worth and admission are
    ``router/economics.py``'s and ``router/admission_ledger.py``'s, in the same registry)."""

    def __init__(self) -> None:
        self._workers: dict[str, WorkerMetrics] = {}
        self._child = Children()
        r = self.registry = CollectorRegistry()
        self.requests = Counter("radix_global_http_requests",
                                "Requests by endpoint and final HTTP status",
                                ["endpoint", "status"], registry=r)
        self.decisions = Counter("radix_global_decisions",
                                 "Routing decisions (accepted or reason)", ["model", "outcome"],
                                 registry=r)
        self.routed = Counter("radix_global_routed_requests", "Requests forwarded, per worker",
                              ["worker"], registry=r)
        self.fetch_tokens = Counter("radix_global_fetch_planned_tokens",
                                    "Tokens planned to fetch from a pool", ["worker"], registry=r)
        self.fetch_bytes = Counter("radix_global_fetch_planned_bytes",
                                   "KV bytes planned to move from a pool", ["worker"], registry=r)
        self.relayed_bytes = Counter("radix_global_relayed_bytes", "Response bytes relayed",
                                     ["worker"], registry=r)
        self.transfer_s = Histogram("radix_global_predicted_transfer_seconds",
                                    "Predicted KV transfer time", buckets=_LATENCY_BUCKETS,
                                    registry=r)
        self.predicted_ttft = Histogram("radix_global_predicted_ttft_seconds", "Predicted TTFT",
                                        buckets=_LATENCY_BUCKETS, registry=r)
        self.actual_ttft = Histogram("radix_global_ttft_seconds", "Observed TTFT (first chunk)",
                                     ["worker"], buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft_error = Histogram("radix_global_ttft_prediction_error_seconds",
                                    "|observed - predicted| TTFT", buckets=_LATENCY_BUCKETS,
                                    registry=r)
        self.queue_s = Histogram("radix_global_predicted_queue_seconds", "Predicted queue time",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.stage_s = Histogram("radix_global_router_stage_seconds", "Router time per stage",
                                 ["stage"], buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01,
                                                     0.03, 0.1, 1), registry=r)
        self.upstream_errors = Counter("radix_global_upstream_errors",
                                       "Upstream failures by kind", ["worker", "kind"],
                                       registry=r)
        self.retries = Counter("radix_global_retries", "Requests retried on another worker",
                               registry=r)
        self.client_aborts = Counter("radix_global_client_aborts",
                                     "Client disconnects (engine aborted)", registry=r)
        self.outstanding = Gauge("radix_global_outstanding_requests",
                                 "In-flight requests per worker", ["worker"], registry=r)
        self.workers = Gauge("radix_global_workers", "Workers by model", ["model"], registry=r)
        self.dispatch_held = Gauge("radix_global_dispatch_held_requests",
                                   "Requests held at the router while the engines are busy "
                                   "(docs/interfaces.md, \"Router-side dispatch: holding "
                                   "requests while the engines are busy\")", registry=r)
        self.dispatch_hold_s = Histogram("radix_global_dispatch_hold_seconds",
                                         "How long released requests were held at the router",
                                         buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_KeyMismatch(self))
        # worker -> whether it never hit where the router expected hits: read when scraped
        self.key_mismatch: Callable[[], Iterable[tuple[str, bool]]] = lambda: ()

    def worker(self, worker_id: str) -> WorkerMetrics:
        w = self._workers.get(worker_id)
        if w is None:
            w = self._workers[worker_id] = WorkerMetrics(*(
                m.labels(worker_id) for m in (
                    self.routed, self.outstanding, self.fetch_tokens, self.fetch_bytes,
                    self.relayed_bytes, self.actual_ttft)))
        return w

    def stage(self, name: str) -> Any:
        """The ``radix_global_router_stage_seconds`` child of ``name``."""
        return self._child(self.stage_s, name)

    def request(self, endpoint: str, status: int) -> Any:
        return self._child(self.requests, endpoint, status)

    def decision(self, model: str, outcome: str) -> Any:
        return self._child(self.decisions, model, outcome)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _KeyMismatch(Collector):
    """``radix_global_key_mismatch``, computed when scraped from the router's counters (a read of
    ``/metrics`` changes nothing)."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily("radix_global_key_mismatch", _MISMATCH_HELP, labels=["worker"])]

    def collect(self) -> list[Metric]:
        family = GaugeMetricFamily("radix_global_key_mismatch", _MISMATCH_HELP, labels=["worker"])
        for worker, mismatch in self._metrics.key_mismatch():
            family.add_metric([worker], 1.0 if mismatch else 0.0)
        return [family]


_MISMATCH_HELP = "1 if the worker never hits where the router expects a hit"
