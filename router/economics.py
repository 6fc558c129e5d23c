"""What the cache was worth, request by request: the live funnel of ``docs/interfaces.md``,
"What the cache is worth, live".

:func:`reuse_of` is pure: one answered attempt's decision, engine answer and measured TTFT ->
:class:`Reuse`. :class:`Economics` books it in the router's Prometheus registry (per model and
worker) and keeps the per-model sums ``/admin/stats`` shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter

from router.keying.prompt import CACHE_TIERS, engine_cached_tiers, engine_cached_tokens
from router.metrics import Children
from router.routing.contract import Decision

UNSPLIT = "unsplit"  # the delivered tier of an answer that gives only the total
TENANT_CAP = 1024  # tenants summed apart; the rest together as OTHER_TENANTS
OTHER_TENANTS = "(other)"
TOP_TENANTS = 10


class Reuse(NamedTuple):
    """One answered request's place in the funnel (tokens, seconds); None: not known."""

    prompt: int
    available: int | None  # longest prefix held anywhere at the decision (router's index)
    captured: int  # the decision's prefix (local + fetched)
    delivered: dict[str, int] | None  # engine cached tokens by tier (or UNSPLIT)
    late: int | None  # planned pool tokens the engine did not load from storage
    prefill_saved_s: float | None  # cost model: cold prefill - prefill with the delivered
    ttft_saved_s: float | None  # cold estimate - observed TTFT (streams only)
    storage_bytes: int | None  # KV bytes the engine loaded from storage (its storage tokens)


def reuse_of(decision: Decision, prompt: int, answer: Any, ttft_s: float | None,
             prefill_s: Callable[[int], float], kv_bytes_per_token: float) -> Reuse:
    """The funnel of one answered attempt. ``answer``: the engine's JSON answer or last stream
    event; ``ttft_s``: the observed first token after the dispatch gate's hold (None: a whole
    answer, whose arrival is no first token); ``prefill_s(prefix)``: the cost model's prefill
    time of this prompt on the chosen worker with ``prefix`` tokens cached;
    ``kv_bytes_per_token``: the namespace's, for the bytes its storage tokens moved."""
    cached, _ = engine_cached_tokens(answer)
    tiers = engine_cached_tiers(answer)
    delivered: dict[str, int] | None = None
    if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0:
        delivered = tiers if tiers is not None and sum(tiers.values()) == cached \
            else {UNSPLIT: cached}
    late = max(0, decision.fetch_tokens - tiers["storage"]) if tiers is not None else None
    cold = prefill_s(0)
    saved = cold - prefill_s(sum(delivered.values())) if delivered is not None else None
    ttft_saved = None
    if ttft_s is not None and decision.predicted_ttft_s is not None:
        ttft_saved = decision.predicted_queue_s + cold - ttft_s
    storage = round(tiers["storage"] * kv_bytes_per_token) if tiers is not None else None
    return Reuse(prompt, decision.available_tokens, decision.prefix_tokens, delivered, late,
                 saved, ttft_saved, storage)


@dataclass
class ModelEconomics:
    """A model's (or a tenant's) sums since the router started (``/admin/stats``
    ``economics``, ``economics_top_tenants``)."""

    requests: int = 0
    prompt_tokens: int = 0
    available_tokens: int = 0
    captured_tokens: int = 0
    delivered_tokens: int = 0
    late_tokens: int = 0
    storage_loaded_bytes: int = 0
    prefill_saved_s: float = 0.0
    ttft_saved_s: float = 0.0  # signed: a request slower than its cold estimate subtracts
    slower_than_cold: int = 0

    def add(self, r: Reuse) -> None:
        self.requests += 1
        self.prompt_tokens += r.prompt
        self.captured_tokens += r.captured
        self.available_tokens += r.available or 0
        self.delivered_tokens += sum((r.delivered or {}).values())
        self.late_tokens += r.late or 0
        self.storage_loaded_bytes += r.storage_bytes or 0
        self.prefill_saved_s += r.prefill_saved_s or 0.0
        if r.ttft_saved_s is not None:
            self.ttft_saved_s += r.ttft_saved_s
            self.slower_than_cold += r.ttft_saved_s < 0


class Economics:
    """The funnel's counters (``radix_global_*``) and per-model sums."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model", "worker"]
        self._models: dict[str, ModelEconomics] = {}
        self._tenants: dict[str, ModelEconomics] = {}
        self._child = Children()  # booked once per answered request: children looked up once
        self.prompt = Counter("radix_global_prompt_tokens", "Prompt tokens of answered "
                              "requests", labels, registry=registry)
        self.available = Counter(
            "radix_global_available_prefix_tokens", "Longest prefix any holder had in the "
            "router's index when the request was decided", labels, registry=registry)
        self.captured = Counter("radix_global_captured_prefix_tokens", "Prefix the router "
                                "planned the chosen worker would not compute", labels,
                                registry=registry)
        self.delivered = Counter("radix_global_delivered_prefix_tokens", "Cached prompt tokens "
                                 "the engine reported, by tier", [*labels, "tier"],
                                 registry=registry)
        self.late = Counter("radix_global_late_prefix_tokens", "Planned pool tokens the engine "
                            "did not load from storage", labels, registry=registry)
        self.prefill_saved = Counter("radix_global_prefill_saved_seconds", "Prefill time the "
                                     "delivered tokens saved (cost model)", labels,
                                     registry=registry)
        self.ttft_saved = Counter("radix_global_ttft_saved_seconds", "Cold TTFT estimate minus "
                                  "observed TTFT, where positive", labels, registry=registry)
        self.storage_bytes = Counter("radix_global_storage_loaded_bytes", "KV bytes the engines "
                                     "loaded from storage (the pool and its disk tier), from "
                                     "their storage tokens", labels, registry=registry)
        self.slower = Counter("radix_global_slower_than_cold_requests", "Streamed requests "
                              "whose first token came later than their cold estimate", labels,
                              registry=registry)

    def book(self, model: str, worker: str, r: Reuse, tenant: str | None = None) -> None:
        """One answered request of ``model`` on ``worker`` (for ``tenant``: its sums too)."""
        self._models.setdefault(model, ModelEconomics()).add(r)
        if tenant is not None:
            if tenant not in self._tenants and len(self._tenants) >= TENANT_CAP:
                tenant = OTHER_TENANTS
            self._tenants.setdefault(tenant, ModelEconomics()).add(r)
        c = self._child
        c(self.prompt, model, worker).inc(r.prompt)
        c(self.captured, model, worker).inc(r.captured)
        if r.available is not None:
            c(self.available, model, worker).inc(r.available)
        for tier, tokens in (r.delivered or {}).items():
            c(self.delivered, model, worker, tier).inc(tokens)
        if r.late is not None:
            c(self.late, model, worker).inc(r.late)
        if r.storage_bytes is not None:
            c(self.storage_bytes, model, worker).inc(r.storage_bytes)
        if r.prefill_saved_s is not None:
            c(self.prefill_saved, model, worker).inc(max(0.0, r.prefill_saved_s))
        if r.ttft_saved_s is not None:
            c(self.ttft_saved, model, worker).inc(max(0.0, r.ttft_saved_s))
            c(self.slower, model, worker).inc(r.ttft_saved_s < 0)

    def stats(self) -> dict[str, dict[str, Any]]:
        return {model: asdict(m) for model, m in self._models.items()}

    def top_tenants(self, n: int = TOP_TENANTS) -> list[dict[str, Any]]:
        """The ``n`` tenants with the most prompt tokens, with their sums (never a Prometheus
        label: tenants are as many as the tenants file has)."""
        ranked = sorted(self._tenants.items(), key=lambda kv: -kv[1].prompt_tokens)[:n]
        return [{"tenant": name, **asdict(m)} for name, m in ranked]


__all__ = ["CACHE_TIERS", "UNSPLIT", "Economics", "ModelEconomics", "Reuse", "reuse_of"]
