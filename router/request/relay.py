"""The forwarding half of a request: an ASGI response that relays a worker's answer.

See ``router/request/handler.py`` for the request half. Life cycle kept here: the routing core
recorded the request as routed when it decided; ``prefill_done`` at the first streamed chunk;
``finished`` exactly once per routed attempt (success, failure, retry elsewhere, or client gone),
through ``router/request/finish.py``. A worker that refused the connection is reported to health
checking and excluded, and the request is routed again (``router/request/route.py``), up to
``max_retries`` times. Native PD (the decision names a decode worker): both halves are sent at
once, with the bootstrap fields of ``router.pd.protocol.native_body``.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from starlette.types import Receive, Scope, Send

from router.cluster.registry import WorkerEntry
from router.keying.prompt import engine_cached_tokens, engine_storage_tokens
from router.pd.protocol import PdError, native_body, new_bootstrap_room
from router.request.finish import Outcome, client_gone, finish
from router.request.inbound import Inbound
from router.request.native_pd import PrefillHalf
from router.request.route import Routed, route
from router.state import RouterState
from router.transport.bodies import encode_with, json_or_none, last_sse_event
from router.transport.errors import ErrorType, send_error, send_failure, sse_error
from router.transport.proxy import (
    ClientGone,
    UpstreamFailed,
    UpstreamGone,
    UpstreamResponse,
    UpstreamUnavailable,
    until_disconnect,
)

log = logging.getLogger("radix_global.router.request")



class DecodeRefused(UpstreamUnavailable):
    """Native PD: the paired decode worker refused the connection. That worker is the one to
    blame (and remove), not the prefill worker; the prefill side was aborted, so the retry may
    pair the prefill worker again, under a new rid."""

    def __init__(self, worker_id: str, cause: UpstreamUnavailable) -> None:
        super().__init__(f"decode worker {worker_id}: {cause}")
        self.worker_id = worker_id


class Forward:
    """ASGI response forwarding one routed request (with retries on refused connections)."""

    def __init__(self, state: RouterState, inbound: Inbound, first: Routed) -> None:
        self.state, self.inbound, self.routed = state, inbound, first
        # Routed (the driver recorded it when it decided) and not yet finished: the queue
        # estimate is released exactly once per routed attempt, however the request ends.
        self.open = True
        self._counted = False  # this attempt's per-worker metrics were started
        self.sent = False  # the engine(s) may hold this attempt's request
        self.started = False  # the answer's head was sent to the client
        self.status_code = 499  # what the client got (499: nothing, it left first)
        self.ttft: float | None = None
        self.tail = b""
        self.pd: PrefillHalf | None = None  # native PD: the half beside the decode worker's
        self.engine_rid = inbound.req.request_id  # new after a decode refusal

    # --- life cycle ---------------------------------------------------------------------------
    def _start(self, routed: Routed) -> None:
        st, req = self.state, self.inbound.req
        d, wid = routed.decision, routed.entry.info.worker_id
        self.open, self._counted, self.sent = True, True, False
        m = st.metrics
        w = m.worker(wid)
        w.routed.inc()
        w.outstanding.inc()
        w.prompt_tokens.inc(req.input_tokens)
        w.avoided_prefill_tokens.inc(d.prefix_tokens)
        if d.fetch_tokens:
            w.fetch_tokens.inc(d.fetch_tokens)
            w.kv_bytes_moved.inc(d.fetch_tokens * st.routing.cost.kv_bytes_per_token(
                req.namespace))
            m.transfer_s.observe(d.predicted_transfer_s)
        if d.predicted_ttft_s is not None:
            m.predicted_ttft.observe(d.predicted_ttft_s)
        m.queue_s.observe(d.predicted_queue_s)
        routed.entry.routed += 1
        if d.prefix_tokens - d.fetch_tokens > 0:
            routed.entry.expected_hits += 1

    def _finish(self, ok: bool, answer: Any = None) -> None:
        if self.pd is not None:
            self.pd.idle()
        if not self.open:
            return
        self.open = False
        st, entry, d = self.state, self.routed.entry, self.routed.decision
        wid = entry.info.worker_id
        w = st.metrics.worker(wid)
        if self._counted:
            w.outstanding.dec()
            self._counted = False
        cached, prompt = engine_cached_tokens(answer)
        if isinstance(cached, int):
            entry.cached_tokens += cached
            entry.prompt_tokens += prompt if isinstance(prompt, int) else \
                self.inbound.req.input_tokens
            w.engine_cached_tokens.inc(cached)
            if cached > 0:
                entry.observed_hits += 1
        if not ok:
            entry.failures += 1
        storage = engine_storage_tokens(answer)
        if storage is not None and d.fetch_tokens > storage:  # predicted, not delivered
            st.metrics.fetch_shortfall.labels(wid).inc(d.fetch_tokens - storage)
        record = {
            "worker_id": wid, "dp_rank": d.dp_rank, "input_tokens": self.inbound.req.input_tokens,
            "predicted_prefix_tokens": d.prefix_tokens, "fetch_tokens": d.fetch_tokens,
            "predicted_ttft_s": d.predicted_ttft_s, "ttft_s": self.ttft,
            "held_s": self.routed.held_s,
            "engine_cached_tokens": cached, "engine_storage_tokens": storage}
        if self.pd is not None:
            record["decode_worker_id"] = self.pd.decode.info.worker_id
        booked = finish(st, self.inbound, ok, Outcome.OK if ok else Outcome.FAILED, record)
        if self.pd is not None:
            self.pd.report_into(booked)  # its cache numbers, now or when it answers

    # --- ASGI ---------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(scope, receive, self._guarded(scope, receive, send))
        except ClientGone:
            client_gone(self.state)
            held = self.open and self.sent
            self._finish(False)  # released now, not after the aborts' round trips
            if held:
                await self._abort_engines()
        finally:
            self._finish(False)

    async def _abort_engines(self) -> None:
        """Every engine request of this attempt (one per prompt of a batch, per PD half)."""
        proxy, inbound = self.state.proxy, self.inbound
        if self.pd is not None:
            for rid in inbound.engine_rids(self.pd.prefill_rid):
                await proxy.abort(self.pd.prefill.info.url, rid)
        for rid in inbound.engine_rids(self.engine_rid):
            await proxy.abort((self.pd.decode if self.pd else self.routed.entry).info.url, rid)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A failure inside forwarding costs this request a clean error answer, never an empty
        reply: a 500 before the head was sent, an error event (or the end) after it."""
        try:
            await self._run(scope, receive, send)
        except ClientGone:
            raise
        except Exception as exc:
            log.exception("forwarding %s failed", self.inbound.req.request_id)
            self.state.metrics.upstream_errors.labels(self.routed.entry.info.worker_id,
                                                      "router").inc()
            self._finish(False)
            if not self.started:
                self.status_code = 500
            await send_failure(send, self.started, self.inbound.stream, exc)

    def _body_for(self, entry: WorkerEntry, rid: str, pd: dict[str, Any] | None = None,
                  dp_rank: int | None = None) -> bytes:
        inbound = self.inbound
        fields = inbound.engine_fields(rid, entry.info.engine)
        if entry.info.engine != "sglang":  # dp rank and bootstrap fields are SGLang's
            return encode_with(inbound.payload, fields, inbound.raw)
        if entry.info.dp_size > 1:
            fields["routed_dp_rank"] = self.routed.decision.dp_rank if dp_rank is None else dp_rank
        if pd is None:
            return encode_with(inbound.payload, fields, inbound.raw)
        return msgspec.json.encode({**pd, **fields})

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        st = self.state
        excluded: set[str] = set()
        attempts = 0
        while True:
            entry = self.routed.entry
            self._start(self.routed)
            t = st.clock()
            try:
                upstream = await self._send(f"{entry.info.url}{self.inbound.path}")
                st.health.connect_ok(entry.info.worker_id)
                break
            except UpstreamUnavailable as exc:
                wid = exc.worker_id if isinstance(exc, DecodeRefused) else entry.info.worker_id
                if isinstance(exc, DecodeRefused):  # the prefill side saw (and dropped) that rid
                    self.engine_rid = f"{self.inbound.req.request_id}-pd{attempts + 1}"
                log.warning("worker %s refused the request: %s", wid, exc)
                st.metrics.upstream_errors.labels(wid, "unavailable").inc()
                self._finish(False)
                if not isinstance(exc, UpstreamGone):  # gone: removed already
                    st.health.connect_failed(wid, exc)  # timeout: kept; refused: removed
                excluded.add(wid)
                attempts += 1
                nxt = route(st, self.inbound, excluded) if attempts <= st.config.proxy.max_retries \
                    else None
                if not isinstance(nxt, Routed):
                    self.started = True
                    if nxt is None:
                        self.status_code = 503
                        await send_error(send, 503, "no worker took the request",
                                         ErrorType.UNAVAILABLE)
                    else:
                        self.status_code = nxt.status_code
                        await nxt(scope, receive, send)
                    return
                st.metrics.retries.inc()
                self.routed = nxt
            except UpstreamFailed as exc:
                st.metrics.upstream_errors.labels(entry.info.worker_id, "failed").inc()
                self._finish(False)
                self.started = True
                self.status_code = 502
                await send_error(send, 502, f"worker failed: {exc}", ErrorType.UPSTREAM)
                return
        st.metrics.stage("proxy_connect").observe(st.clock() - t)
        if self.inbound.stream:
            await self._relay_stream(upstream, send)
        else:
            await self._relay_whole(upstream, send)

    async def _post(self, url: str, body: bytes, rid: str) -> UpstreamResponse:
        proxy, headers = self.state.proxy, {**self.inbound.headers, "x-request-id": rid}
        self.sent = True
        if self.inbound.stream:
            return await proxy.open_stream(url, body, headers)
        return await proxy.post(url, body, headers)

    async def _send(self, url: str) -> UpstreamResponse:
        """Send to the chosen worker; in native PD to the prefill and the decode worker at once
        (SGLang's PD protocol: one bootstrap room per prompt, the prefill worker's bootstrap
        address); the client gets the decode worker's answer."""
        st, entry, d = self.state, self.routed.entry, self.routed.decision
        decode = st.registry.find(d.decode_worker_id) if d.decode_worker_id else None
        if decode is None:
            self.pd = None
            return await self._post(url, self._body_for(entry, self.engine_rid), self.engine_rid)
        try:
            pd = native_body(self.inbound.payload, entry.info.url, entry.info.bootstrap_port or 0,
                             new_bootstrap_room())
        except PdError as exc:
            raise UpstreamFailed(f"native PD with prefill worker {entry.worker_id}: {exc}") \
                from exc
        half = self.pd = PrefillHalf(st, self.inbound, entry, decode, self.engine_rid)
        self.sent = True
        # the prefill half's answer is read whole (only its cache numbers are kept)
        half.send(url, self._body_for(entry, half.prefill_rid, {**pd, "stream": False}),
                  {**self.inbound.headers, "x-request-id": half.prefill_rid})
        body = self._body_for(decode, self.engine_rid, pd, dp_rank=d.decode_dp_rank)
        try:
            return await self._post(f"{decode.info.url}{self.inbound.path}", body,
                                    self.engine_rid)
        except UpstreamUnavailable as exc:
            half.cancel()
            # The prefill worker may hold the request already, waiting for this decode side.
            for rid in self.inbound.engine_rids(half.prefill_rid):
                await st.proxy.abort(entry.info.url, rid)
            raise DecodeRefused(decode.worker_id, exc) from exc
        except BaseException:
            half.cancel()
            raise

    def _observe_first(self) -> None:
        st = self.state
        now = st.clock()
        self.ttft = now - self.inbound.t0
        st.routing.prefill_done(self.inbound.req.request_id, now)
        st.metrics.worker(self.routed.entry.info.worker_id).actual_ttft.observe(self.ttft)
        predicted = self.routed.decision.predicted_ttft_s
        if predicted is not None:  # predicted when it was routed, after its hold at the gate
            st.metrics.ttft_error.observe(abs(self.ttft - self.routed.held_s - predicted))

    async def _relay_whole(self, upstream: UpstreamResponse, send: Send) -> None:
        content = upstream.content
        self.ttft = self.state.clock() - self.inbound.t0
        self.started = True
        self.status_code = upstream.status_code
        await send({"type": "http.response.start", "status": upstream.status_code,
                    "headers": [*upstream.headers, (b"content-length", b"%d" % len(content)),
                                *self.routed.headers(self.engine_rid)]})
        self.state.metrics.worker(self.routed.entry.info.worker_id).proxied_bytes.inc(len(content))
        await send({"type": "http.response.body", "body": content, "more_body": False})
        answer = json_or_none(content) if upstream.status_code == 200 else None
        self._finish(upstream.status_code < 500, answer)

    async def _relay_stream(self, upstream: UpstreamResponse, send: Send) -> None:
        wid = self.routed.entry.info.worker_id
        ok = upstream.status_code < 500
        try:
            self.started, self.status_code = True, upstream.status_code
            await send({"type": "http.response.start", "status": upstream.status_code,
                        "headers": [*upstream.headers,
                                    *self.routed.headers(self.engine_rid)]})
            relayed = 0
            try:
                async for chunk in upstream.aiter_raw():
                    if self.ttft is None:
                        self._observe_first()
                    relayed += len(chunk)
                    self.tail = (self.tail + chunk)[-65536:]
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamFailed as exc:
                ok = False
                self.state.metrics.upstream_errors.labels(wid, "mid_stream").inc()
                log.warning("worker %s failed mid-stream: %r", wid, exc)
                await send({"type": "http.response.body",
                            "body": sse_error(f"worker {wid} failed mid-stream: {exc!r}"),
                            "more_body": True})
            self.state.metrics.worker(wid).proxied_bytes.inc(relayed)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await upstream.aclose()
        self._finish(ok, last_sse_event(self.tail))
