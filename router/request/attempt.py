"""One routed attempt of a request, and every metric it books.

The routing core recorded the attempt when it decided. :meth:`Attempt.begin` books it against its
worker when the relay sends it; :meth:`Attempt.first_token` books the observed TTFT;
:meth:`Attempt.close` releases it exactly once, however it ends (answered, failed, refused and
retried elsewhere, or the client gone), booking the engine's cache numbers and the request's
record (``router/request/finish.py``). The relays move bytes and call these; they keep no
metrics of their own.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from router.keying.prompt import engine_cached_tokens, engine_storage_tokens
from router.request.booking import book_answer
from router.request.finish import Outcome, finish
from router.request.inbound import Inbound
from router.request.native_pd import PrefillHalf
from router.request.route import Routed
from router.state import RouterState


class UpstreamError(StrEnum):
    """The ``kind`` label of ``radix_global_upstream_errors``."""

    UNAVAILABLE = "unavailable"  # refused the connection (or timed out): routed elsewhere
    FAILED = "failed"  # answered with a broken response
    MID_STREAM = "mid_stream"  # broke after the answer began
    ROUTER = "router"  # the router failed while forwarding


class Attempt:
    """Where the attempt went (``routed``), under which engine request id, and how far it got."""

    def __init__(self, state: RouterState, inbound: Inbound, routed: Routed, engine_rid: str
                 ) -> None:
        self.state, self.inbound, self.routed, self.engine_rid = state, inbound, routed, engine_rid
        self.pd: PrefillHalf | None = None  # native PD: the half beside the decode worker's
        self.open = True  # routed and not yet closed
        self.sent = False  # the engine(s) may hold the request
        self.status: int | None = None  # the answer's HTTP status, once its head arrived
        self._counted = False  # the worker's outstanding gauge counts it

    @property
    def worker_id(self) -> str:
        return self.routed.entry.info.worker_id

    def begin(self) -> None:
        """The attempt is being sent to its worker."""
        st, req, d = self.state, self.inbound.req, self.routed.decision
        m = st.metrics
        w = m.worker(self.worker_id)
        w.routed.inc()
        w.outstanding.inc()
        if d.fetch_tokens:
            w.fetch_tokens.inc(d.fetch_tokens)
            w.fetch_bytes.inc(d.fetch_tokens * st.routing.cost.kv_bytes_per_token(
                req.namespace))
            m.transfer_s.observe(d.predicted_transfer_s)
        if d.predicted_ttft_s is not None:
            m.predicted_ttft.observe(d.predicted_ttft_s)
        m.queue_s.observe(d.predicted_queue_s)
        self.routed.entry.routed += 1
        if d.prefix_tokens - d.fetch_tokens > 0:
            self.routed.entry.expected_hits += 1
        self._counted = True

    def first_token(self, ttft_s: float) -> None:
        """The first streamed chunk arrived, ``ttft_s`` after the request did."""
        st, d = self.state, self.routed.decision
        st.routing.prefill_done(self.inbound.req.request_id, st.clock())
        st.metrics.worker(self.worker_id).actual_ttft.observe(ttft_s)
        if d.predicted_ttft_s is not None:  # predicted when it was routed, after its gate hold
            st.metrics.ttft_error.observe(abs(ttft_s - self.routed.held_s - d.predicted_ttft_s))

    def upstream_error(self, kind: UpstreamError, worker_id: str | None = None) -> None:
        """A failure of ``kind`` at ``worker_id`` (default: this attempt's worker)."""
        self.state.metrics.upstream_errors.labels(worker_id or self.worker_id, kind.value).inc()

    def relayed(self, size: int) -> None:
        self.state.metrics.worker(self.worker_id).relayed_bytes.inc(size)

    def close(self, ok: bool, answer: Any = None, ttft_s: float | None = None,
              end_s: float | None = None) -> None:
        """Release the attempt (idempotent) and book how it ended; ``answer``: the engine's
        JSON answer or final stream event, for its cache numbers; ``ttft_s`` / ``end_s``: its
        first and last bytes after the request arrived."""
        if self.pd is not None:
            self.pd.idle()
        if not self.open:
            return
        self.open = False
        st, entry, d = self.state, self.routed.entry, self.routed.decision
        w = st.metrics.worker(self.worker_id)
        if self._counted:
            w.outstanding.dec()
            self._counted = False
        cached, prompt = engine_cached_tokens(answer)
        if isinstance(cached, int):
            entry.cached_tokens += cached
            entry.prompt_tokens += prompt if isinstance(prompt, int) else \
                self.inbound.req.input_tokens
            if cached > 0:
                entry.observed_hits += 1
        if not ok:
            entry.failures += 1
        answered = ok and self.status == 200  # a 4xx is the engine's refusal, not an answer
        book_answer(st, self.inbound, self.routed, answered, answer, answer, ttft_s, end_s)
        storage = engine_storage_tokens(answer)
        record = {
            "worker_id": self.worker_id, "dp_rank": d.dp_rank,
            "input_tokens": self.inbound.req.input_tokens,
            "available_tokens": d.available_tokens,
            "predicted_prefix_tokens": d.prefix_tokens, "fetch_tokens": d.fetch_tokens,
            "predicted_ttft_s": d.predicted_ttft_s, "ttft_s": ttft_s,
            "held_s": self.routed.held_s,
            "engine_cached_tokens": cached, "engine_storage_tokens": storage}
        if d.fetch_pieces:  # which segment each part of a store's run was planned from
            record["fetch_pieces"] = [[p.holder, p.first_page, p.end_page]
                                      for p in d.fetch_pieces]
        if self.pd is not None:
            record["decode_worker_id"] = self.pd.decode.info.worker_id
        booked = finish(st, self.inbound, ok, Outcome.OK if ok else Outcome.FAILED, record)
        if self.pd is not None:
            self.pd.report_into(booked)  # its cache numbers, now or when it answers
