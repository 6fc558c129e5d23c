"""The forwarding half of a request: an ASGI response that relays a worker's answer.

See ``router/request/handler.py`` for the request half. Life cycle kept here:
``RoutingCore.routed`` when
a worker is about to receive the request, ``first_token`` at the first streamed chunk,
``finished`` exactly once (success, failure, retry elsewhere, or client gone).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import msgspec
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from radix_global.types import Role, WorkerId
from router.cluster.registry import WorkerEntry
from router.keying.prompt import engine_cached_tokens
from router.pd.native import native_util
from router.routing.contract import Decision, RouteRequest
from router.state import RouterState
from router.transport.bodies import encode_with, last_sse_event
from router.transport.proxy import (
    ClientGone,
    UpstreamFailed,
    UpstreamResponse,
    UpstreamUnavailable,
    forward_headers,
    sse_error,
    until_disconnect,
)

log = logging.getLogger("radix_global.router.request.handler")


class Routed(NamedTuple):
    decision: Decision
    entry: WorkerEntry


def _err(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}},
                        status_code=status)


class DecodeRefused(UpstreamUnavailable):
    """Native PD: the paired decode worker refused the connection. That worker is the one to
    blame (and remove), not the prefill worker; the prefill side was aborted, so the retry may
    pair the prefill worker again, under a new rid."""

    def __init__(self, worker_id: str, cause: UpstreamUnavailable) -> None:
        super().__init__(f"decode worker {worker_id}: {cause}")
        self.worker_id = worker_id


class Forward:
    """ASGI response forwarding one routed request (with retries on refused connections)."""

    def __init__(self, state: RouterState, req: RouteRequest, payload: dict[str, Any],
                 salt: str | None, kind: str, path: str, model: str, first: Routed,
                 headers: dict[str, str], *, stream: bool, t0: float,
                 route: Callable[[set[str]], Routed | Response], raw: bytes | None = None
                 ) -> None:
        self.state, self.req, self.payload, self.salt = state, req, payload, salt
        self.raw = raw  # the client's body, ``payload`` encoded
        self.kind, self.path, self.model, self.routed = kind, path, model, first
        self.headers, self.stream, self.t0, self.route = headers, stream, t0, route
        self.open = False  # routed and not yet finished
        self.ttft: float | None = None
        self.tail = b""
        self.decode_entry: WorkerEntry | None = None
        self._pd_open: list[WorkerId] = []  # native PD workers busy with this request
        self.engine_rid = req.request_id  # the rid the engines see (new after a decode refusal)

    # --- life cycle ---------------------------------------------------------------------------
    def _start(self, routed: Routed) -> None:
        st = self.state
        d, wid = routed.decision, routed.entry.info.worker_id
        self.open = True  # the driver recorded it as routed when it decided
        m = st.metrics
        w = m.worker(wid)
        w.routed.inc()
        w.outstanding.inc()
        w.prompt_tokens.inc(self.req.input_tokens)
        w.avoided_prefill_tokens.inc(d.prefix_tokens)
        if d.fetch_tokens:
            w.fetch_tokens.inc(d.fetch_tokens)
            ns_bytes = st.routing.cost.kv_bytes_per_token(self.req.namespace)
            w.kv_bytes_moved.inc(d.fetch_tokens * ns_bytes)
            m.transfer_s.observe(d.predicted_transfer_s)
        if d.predicted_ttft_s is not None:
            m.predicted_ttft.observe(d.predicted_ttft_s)
        m.queue_s.observe(d.predicted_queue_s)
        routed.entry.routed += 1
        if d.prefix_tokens - d.fetch_tokens > 0:
            routed.entry.expected_hits += 1

    def _finish(self, ok: bool, answer: Any = None) -> None:
        if self._pd_open:
            self._pd_idle()
        if not self.open:
            return
        self.open = False
        st, entry, d = self.state, self.routed.entry, self.routed.decision
        now = st.clock()
        st.routing.finished(self.req.request_id, ok, now)
        wid = entry.info.worker_id
        w = st.metrics.worker(wid)
        w.outstanding.dec()
        cached, prompt = engine_cached_tokens(answer)
        if isinstance(cached, int):
            entry.cached_tokens += cached
            entry.prompt_tokens += prompt if isinstance(prompt, int) else self.req.input_tokens
            w.engine_cached_tokens.inc(cached)
            if cached > 0:
                entry.observed_hits += 1
                if d.prefix_tokens - d.fetch_tokens > 0:
                    entry.extra["confirmed_hits"] = entry.extra.get("confirmed_hits", 0) + 1
        if not ok:
            entry.failures += 1
        st.totals["ok" if ok else "failed"] += 1
        st.recent.append({
            "request_id": self.req.request_id, "accepted": True, "worker_id": wid,
            "dp_rank": d.dp_rank, "input_tokens": self.req.input_tokens,
            "predicted_prefix_tokens": d.prefix_tokens, "fetch_tokens": d.fetch_tokens,
            "predicted_ttft_s": d.predicted_ttft_s, "ttft_s": self.ttft,
            "engine_cached_tokens": cached, "ok": ok})

    # --- ASGI ---------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(scope, receive, self._run(scope, receive, send))
        except ClientGone:
            self.state.metrics.client_aborts.inc()
            self.state.totals["client_aborts"] += 1
            started = self.open
            self._finish(False)  # released now, not after the aborts' round trips
            if started:
                await self.state.proxy.abort(self.routed.entry.info.url, self.engine_rid)
                if self.decode_entry is not None:
                    await self.state.proxy.abort(self.decode_entry.info.url, self.engine_rid)
        finally:
            self._finish(False)

    def _body_for(self, entry: WorkerEntry, extra: dict[str, Any] | None = None,
                  dp_rank: int | None = None) -> bytes:
        fields: dict[str, Any] = {}
        d = self.routed.decision
        if entry.info.engine == "sglang":
            if not isinstance(self.payload.get("rid"), list):
                fields["rid"] = self.engine_rid
            if entry.info.dp_size > 1:
                fields["routed_dp_rank"] = d.dp_rank if dp_rank is None else dp_rank
            fields.update(extra or {})
        if self.salt is not None:
            fields["cache_salt"] = self.salt
        return encode_with(self.payload, fields, self.raw)

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        st = self.state
        excluded: set[str] = set()
        attempts = 0
        while True:
            entry = self.routed.entry
            url = f"{entry.info.url}{self.path}"
            self._start(self.routed)
            t = st.clock()
            try:
                upstream = await self._send(url)
                st.health.connect_ok(entry.info.worker_id)
                break
            except UpstreamUnavailable as exc:
                wid = exc.worker_id if isinstance(exc, DecodeRefused) else entry.info.worker_id
                if isinstance(exc, DecodeRefused):  # the prefill side saw (and dropped) that rid
                    self.engine_rid = f"{self.req.request_id}-pd{attempts + 1}"
                log.warning("worker %s refused the request: %s", wid, exc)
                st.metrics.upstream_errors.labels(wid, "unavailable").inc()
                self._finish(False)
                st.health.connect_failed(wid, exc)  # timeout: kept; refused: removed
                excluded.add(wid)
                attempts += 1
                nxt = self.route(excluded) if attempts <= st.config.max_retries else None
                if not isinstance(nxt, Routed):
                    resp = nxt if isinstance(nxt, Response) else _err(
                        503, "no worker took the request", "service_unavailable")
                    await resp(scope, receive, send)
                    return
                st.metrics.retries.inc()
                self.routed = nxt
            except UpstreamFailed as exc:
                st.metrics.upstream_errors.labels(entry.info.worker_id, "failed").inc()
                self._finish(False)
                await _err(502, f"worker failed: {exc}", "upstream_error")(scope, receive, send)
                return
        st.metrics.stage("proxy_connect").observe(st.clock() - t)
        if self.stream:
            await self._relay_stream(upstream, send)
        else:
            await self._relay_whole(upstream, send)

    async def _send(self, url: str) -> UpstreamResponse:
        """Send to the chosen worker. PD disaggregation (the decision names a decode worker):
        send to the prefill and the decode worker at once with one bootstrap room, as SGLang's
        PD protocol wants; the client gets the decode worker's answer."""
        st, entry, d = self.state, self.routed.entry, self.routed.decision
        headers = forward_headers(self.headers)
        self.decode_entry = st.registry.find(d.decode_worker_id) if d.decode_worker_id else None
        if self.decode_entry is None:
            body = self._body_for(entry)
            if self.stream:
                return await st.proxy.open_stream(url, body, headers)
            return await st.proxy.post(url, body, headers)
        decode = self.decode_entry
        pd = {"bootstrap_host": urlsplit(entry.info.url).hostname,
              "bootstrap_port": entry.info.bootstrap_port,
              "bootstrap_room": random.getrandbits(63)}
        self._pd_busy(entry.worker_id, decode.worker_id)
        prefill = asyncio.ensure_future(st.proxy.post(url, self._body_for(entry, pd), headers))
        self._prefill_task = prefill  # its answer is dropped; a failure aborts the decode side
        prefill.add_done_callback(self._prefill_done)
        decode_url = f"{decode.info.url}{self.path}"
        body = self._body_for(decode, pd, dp_rank=d.decode_dp_rank)
        try:
            if self.stream:
                return await st.proxy.open_stream(decode_url, body, headers)
            return await st.proxy.post(decode_url, body, headers)
        except UpstreamUnavailable as exc:
            prefill.cancel()
            # The prefill worker may hold the request already, waiting for this decode side.
            await st.proxy.abort(entry.info.url, self.engine_rid)
            raise DecodeRefused(decode.worker_id, exc) from exc
        except BaseException:
            prefill.cancel()
            raise

    def _pd_busy(self, prefill: WorkerId, decode: WorkerId) -> None:
        """Both halves busy from now (the utilisation report, ``router/pd/native.py``)."""
        st, now = self.state, self.state.clock()
        util = native_util(st)
        util.known_workers((e.worker_id, e.info.role) for e in st.registry.for_model(self.model)
                           if e.info.role in (Role.PREFILL, Role.DECODE))
        util.begin(prefill, Role.PREFILL, now)
        util.begin(decode, Role.DECODE, now)
        self._pd_open = [prefill, decode]

    def _pd_idle(self, worker: WorkerId | None = None) -> None:
        """``worker`` (default: every one still open) done with this request."""
        now = self.state.clock()
        for wid in [w for w in self._pd_open if worker is None or w == worker]:
            native_util(self.state).end(wid, now)
            self._pd_open.remove(wid)

    def _prefill_done(self, task: asyncio.Future[UpstreamResponse]) -> None:
        self._pd_idle(self.routed.entry.worker_id)
        if task.cancelled():
            return
        exc = task.exception()
        failed = exc is not None or task.result().status_code >= 400
        if failed and self.decode_entry is not None:
            log.warning("prefill of %s failed (%r): aborting its decode", self.req.request_id, exc)
            abort = self.state.proxy.abort(self.decode_entry.info.url, self.req.request_id)
            self._abort_task = asyncio.ensure_future(abort)

    def _extra_headers(self) -> list[tuple[bytes, bytes]]:
        d = self.routed.decision
        return [(b"x-radix-worker", self.routed.entry.info.worker_id.encode()),
                (b"x-radix-prefix-tokens", str(d.prefix_tokens).encode()),
                (b"x-radix-request-id", self.engine_rid.encode())]

    def _observe_first(self) -> None:
        st = self.state
        now = st.clock()
        self.ttft = now - self.t0
        st.routing.prefill_done(self.req.request_id, now)
        wid = self.routed.entry.info.worker_id
        st.metrics.worker(wid).actual_ttft.observe(self.ttft)
        predicted = self.routed.decision.predicted_ttft_s
        if predicted is not None:
            st.metrics.ttft_error.observe(abs(self.ttft - predicted))

    async def _relay_whole(self, upstream: UpstreamResponse, send: Send) -> None:
        content = upstream.content
        self.ttft = self.state.clock() - self.t0
        await send({"type": "http.response.start", "status": upstream.status_code,
                    "headers": [*upstream.headers, (b"content-length", b"%d" % len(content)),
                                *self._extra_headers()]})
        self.state.metrics.worker(self.routed.entry.info.worker_id).proxied_bytes.inc(len(content))
        await send({"type": "http.response.body", "body": content, "more_body": False})
        try:
            answer = msgspec.json.decode(content) if upstream.status_code == 200 else None
        except msgspec.DecodeError:
            answer = None
        self._finish(upstream.status_code < 500, answer)

    async def _relay_stream(self, upstream: UpstreamResponse, send: Send) -> None:
        wid = self.routed.entry.info.worker_id
        ok = upstream.status_code < 500
        try:
            await send({"type": "http.response.start", "status": upstream.status_code,
                        "headers": [*upstream.headers, *self._extra_headers()]})
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
