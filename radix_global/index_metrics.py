"""The index's health as Prometheus metrics, read when scraped: its size (by tier too), what it
applied and refused, and how the KV event feeds go (gaps, replays, resyncs, refusals by reason,
lag behind the engines).

One collector for both places an index lives: the standalone service (``radix-global index
serve --metrics-port``) and the router's embedded index (in the router's ``/metrics``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from radix_global.event_lag import LagStats
from radix_global.locset import TIER_NAMES
from radix_global.shards import stats_dict
from radix_global.subscriber import SubscriberStats

_SIZE = (("namespaces", "Namespaces in the index"), ("pages", "Pages held (page, holder)"),
         ("nodes", "Radix tree nodes"), ("holders", "Workers and pools holding pages"))
_INDEX_COUNTS = (("ops_applied", "Index operations applied"),
                 ("pages_stored", "Pages stored"), ("pages_removed", "Pages removed"),
                 ("unknown_removed", "Removals of pages the index did not hold"))
_FEED_COUNTS = (("batches", "KV event batches decoded (live and replayed)"),
                ("ops_applied", "Index operations the feeds applied"),
                ("gaps", "Sequence gaps in a feed"), ("replays", "Replay requests sent"),
                ("replay_failures", "Replays that timed out, failed or did not cover the gap"),
                ("resyncs", "Times a worker's entries were dropped to resync from live events"),
                ("duplicates", "Live batches already applied from a replay"),
                ("timeouts", "Workers removed for silence"),
                ("restarts", "Publishers whose sequence went backwards (engine restarted)"),
                ("subscribe_failures", "Publisher endpoints that could not be subscribed"),
                ("replay_lost", "Replayed batches whose payload did not decode"))


class IndexCollector(Collector):
    """``radix_global_index_*`` from ``index()`` (an index's ``stats()``: ``IndexStats``, or a
    sharded index's sums); ``radix_global_kv_events_*`` from ``feeds()`` (None: this index has
    no event subscriber)."""

    def __init__(self, index: Callable[[], Any],
                 feeds: Callable[[], SubscriberStats | None]) -> None:
        self._index, self._feeds = index, feeds

    def describe(self) -> Iterable[Metric]:
        return []  # collected on each scrape: nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        s = stats_dict(self._index())
        for name, help_ in _SIZE:
            yield GaugeMetricFamily(f"radix_global_index_{name}", help_, value=s.get(name, 0))
        for name, help_ in (("pages", "Distinct pages with a copy at the tier"),
                            ("nodes", "Radix tree nodes with a copy at the tier")):
            by_tier = s.get(f"tier_{name}") or {}
            family = GaugeMetricFamily(f"radix_global_index_tier_{name}", help_, labels=["tier"])
            for tier in TIER_NAMES:
                family.add_metric([tier], by_tier.get(tier, 0))
            yield family
        for name, help_ in _INDEX_COUNTS:
            yield CounterMetricFamily(f"radix_global_index_{name}", help_, value=s.get(name, 0))
        refused = dict(s.get("refused") or {})
        for reason, n in (s.get("router_refused") or {}).items():  # a sharded index's own
            refused[f"shard_{reason}"] = n
        yield _by_reason("radix_global_index_refused", "Index operations refused", refused)
        f = self._feeds()
        if f is None:
            return
        yield GaugeMetricFamily("radix_global_kv_event_feeds", "Workers the event subscriber "
                                "tracks (their KV events, where they publish, and liveness)",
                                value=f.workers)
        for name, help_ in _FEED_COUNTS:
            yield CounterMetricFamily(f"radix_global_kv_events_{name}", help_,
                                      value=getattr(f, name))
        yield _by_reason("radix_global_kv_events_refused", "KV events refused (decoder and "
                         "index refusals, bad frames)", f.refused)
        if f.lag is not None:
            yield from _lag(f.lag)


def _lag(lag: LagStats) -> Iterable[Metric]:
    cumulative, buckets = 0, []
    for bound, n in zip((*lag.bounds_s, float("inf")), lag.counts, strict=True):
        cumulative += n
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    yield HistogramMetricFamily(
        "radix_global_kv_event_lag_seconds", "Live KV event batches' lag: arrival (our wall "
        "clock) minus the publisher's stamp", buckets=buckets, sum_value=lag.sum_s)
    per = GaugeMetricFamily("radix_global_kv_event_worker_lag_seconds",
                            "The last live batch's lag, per worker", labels=["worker"])
    for worker, seconds in sorted(lag.by_worker.items()):
        per.add_metric([worker], seconds)
    yield per


def _by_reason(name: str, help_: str, counts: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_, labels=["reason"])
    for reason, n in sorted(counts.items()):
        family.add_metric([reason], n)
    return family
