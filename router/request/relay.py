"""The forwarding half of a request: an ASGI response that relays a worker's answer.

See ``router/request/handler.py`` for the request half. Each routed attempt is an
:class:`router.request.attempt.Attempt`, which books its life cycle and metrics (closed exactly
once: success, failure, retry elsewhere, or client gone); this module moves bytes. A worker that
refused the connection is reported to health checking and excluded, and the request is routed
again (``router/request/route.py``), up to ``max_retries`` times. Native PD (the decision names a
decode worker): both halves are sent at once, with the bootstrap fields of
``router.pd.protocol.native_body``.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from starlette.types import Receive, Scope, Send

from router.cluster.registry import WorkerEntry
from router.pd.protocol import PdError, native_body, new_bootstrap_room
from router.request.attempt import Attempt, UpstreamError
from router.request.finish import client_gone
from router.request.inbound import Inbound
from router.request.native_pd import PrefillHalf
from router.request.route import Routed, route
from router.state import RouterState
from router.transport.bodies import json_or_none, last_sse_event
from router.transport.errors import (
    ErrorType,
    HttpError,
    openai_error_body,
    send_failure,
    sse_error,
)
from router.transport.openai_stream import StreamEdit, without_details
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
        self.state, self.inbound = state, inbound
        self.attempt = Attempt(state, inbound, first, inbound.req.request_id)
        self.started = False  # the answer's head was sent to the client
        self.status_code = 499  # what the client got (499: nothing, it left first)
        self.ttft: float | None = None  # first byte of the answer, after the request arrived
        self.end: float | None = None  # its last byte, likewise
        self.tail = b""

    # --- ASGI ---------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(scope, receive, self._guarded(send))
        except ClientGone:
            if self.inbound.stream and self.tail.rstrip().endswith(b"data: [DONE]"):
                # it left after the end of the answer (clients close on [DONE], often before
                # the engine's connection ends): answered, nothing to abort
                self.end = self.state.clock() - self.inbound.t0
                self._close(True, last_sse_event(self.tail))
                return
            client_gone(self.state)
            held = self.attempt.open and self.attempt.sent
            self._close(False)  # released now, not after the aborts' round trips
            if held:
                await self._abort_engines()
        finally:
            self._close(False)

    def _close(self, ok: bool, answer: Any = None) -> None:
        self.attempt.close(ok, answer, self.ttft, self.end)

    async def _abort_engines(self) -> None:
        """Every engine request of this attempt (one per prompt of a batch, per PD half)."""
        proxy, inbound, a = self.state.proxy, self.inbound, self.attempt
        if a.pd is not None:
            for rid in inbound.engine_rids(a.pd.prefill_rid):
                await proxy.abort(a.pd.prefill.info.url, rid)
        for rid in inbound.engine_rids(a.engine_rid):
            await proxy.abort((a.pd.decode if a.pd else a.routed.entry).info.url, rid)

    async def _guarded(self, send: Send) -> None:
        """A failure inside forwarding costs this request a clean error answer, never an empty
        reply: a 500 before the head was sent, an error event (or the end) after it."""
        try:
            await self._run(send)
        except ClientGone:
            raise
        except Exception as exc:
            log.exception("forwarding %s failed", self.inbound.req.request_id)
            self.attempt.upstream_error(UpstreamError.ROUTER)
            self._close(False)
            if not self.started:
                self.status_code = 500
            await send_failure(send, self.started, self.inbound.stream, exc)

    async def _refuse(self, send: Send, refusal: HttpError) -> None:
        self.started, self.status_code = True, refusal.status
        await refusal.send(send)

    def _body_for(self, entry: WorkerEntry, rid: str, pd: dict[str, Any] | None = None,
                  dp_rank: int | None = None) -> bytes:
        inbound = self.inbound
        fields = inbound.engine_fields(rid, entry.info.engine)
        if entry.info.engine != "sglang":  # dp rank and bootstrap fields are SGLang's
            return inbound.engine_body(fields)
        if entry.info.dp_size > 1:
            fields["routed_dp_rank"] = (self.attempt.routed.decision.dp_rank if dp_rank is None
                                        else dp_rank)
        if pd is None:
            return inbound.engine_body(fields)
        return msgspec.json.encode({**pd, **fields})

    async def _run(self, send: Send) -> None:
        st = self.state
        excluded: set[str] = set()
        attempts = 0
        while True:
            a = self.attempt
            a.begin()
            t = st.clock()
            try:
                upstream = await self._send(a)
                st.health.connect_ok(a.worker_id)
                break
            except UpstreamUnavailable as exc:
                wid = exc.worker_id if isinstance(exc, DecodeRefused) else a.worker_id
                log.warning("worker %s refused the request: %s", wid, exc)
                a.upstream_error(UpstreamError.UNAVAILABLE, wid)
                self._close(False)
                if not isinstance(exc, UpstreamGone):  # gone: removed already
                    st.health.connect_failed(wid, exc)  # timeout: kept; refused: removed
                excluded.add(wid)
                attempts += 1
                # the prefill side of a refused decode saw (and dropped) that rid: a new one
                rid = f"{self.inbound.req.request_id}-pd{attempts}" \
                    if isinstance(exc, DecodeRefused) else a.engine_rid
                try:
                    if attempts > st.config.proxy.max_retries:
                        raise HttpError(503, "no worker took the request",
                                        ErrorType.UNAVAILABLE) from exc
                    self.attempt = Attempt(st, self.inbound, route(st, self.inbound, excluded),
                                           rid)
                except HttpError as refusal:
                    await self._refuse(send, refusal)
                    return
                st.metrics.retries.inc()
            except UpstreamFailed as exc:
                a.upstream_error(UpstreamError.FAILED)
                self._close(False)
                await self._refuse(send, HttpError(502, f"worker failed: {exc}",
                                                   ErrorType.UPSTREAM))
                return
        st.metrics.stage("proxy_connect").observe(st.clock() - t)
        if self.inbound.stream:
            await self._relay_stream(upstream, send)
        else:
            await self._relay_whole(upstream, send)

    async def _post(self, url: str, body: bytes, rid: str) -> UpstreamResponse:
        proxy, headers = self.state.proxy, {**self.inbound.headers, "x-request-id": rid}
        self.attempt.sent = True
        if self.inbound.stream:
            return await proxy.open_stream(url, body, headers)
        return await proxy.post(url, body, headers)

    async def _send(self, a: Attempt) -> UpstreamResponse:
        """Send to the chosen worker; in native PD to the prefill and the decode worker at once
        (SGLang's PD protocol: one bootstrap room per prompt, the prefill worker's bootstrap
        address); the client gets the decode worker's answer."""
        st, entry, d = self.state, a.routed.entry, a.routed.decision
        url = f"{entry.info.url}{self.inbound.path}"
        decode = st.registry.find(d.decode_worker_id) if d.decode_worker_id else None
        if decode is None:
            a.pd = None
            return await self._post(url, self._body_for(entry, a.engine_rid), a.engine_rid)
        try:
            pd = native_body(self.inbound.payload(), self.inbound.batch, entry.info.url,
                             entry.info.bootstrap_port or 0, new_bootstrap_room())
        except PdError as exc:
            raise UpstreamFailed(f"native PD with prefill worker {entry.worker_id}: {exc}") \
                from exc
        half = a.pd = PrefillHalf(st, self.inbound, entry, decode, a.engine_rid)
        a.sent = True
        # the prefill half's answer is read whole (only its cache numbers are kept)
        half.send(url, self._body_for(entry, half.prefill_rid, {**pd, "stream": False}),
                  {**self.inbound.headers, "x-request-id": half.prefill_rid})
        body = self._body_for(decode, a.engine_rid, pd, dp_rank=d.decode_dp_rank)
        try:
            return await self._post(f"{decode.info.url}{self.inbound.path}", body,
                                    a.engine_rid)
        except UpstreamUnavailable as exc:
            half.cancel()
            # The prefill worker may hold the request already, waiting for this decode side.
            for rid in self.inbound.engine_rids(half.prefill_rid):
                await st.proxy.abort(entry.info.url, rid)
            raise DecodeRefused(decode.worker_id, exc) from exc
        except BaseException:
            half.cancel()
            raise

    async def _relay_whole(self, upstream: UpstreamResponse, send: Send) -> None:
        content, a, status = upstream.content, self.attempt, upstream.status_code
        self.ttft = self.state.clock() - self.inbound.t0
        self.started = True
        self.status_code = a.status = status
        answer = json_or_none(content) if status == 200 else None
        if status >= 400:  # the engine's error, in the router's shape
            content = openai_error_body(content, status) or content
        elif self.inbound.drops_details(a.routed.entry.info.engine):
            stripped = without_details(answer)  # the router asked for them, not the client
            content = msgspec.json.encode(stripped) if stripped is not None else content
        await send({"type": "http.response.start", "status": status,
                    "headers": [*upstream.headers, (b"content-length", b"%d" % len(content)),
                                *a.routed.headers(a.engine_rid)]})
        a.relayed(len(content))
        await send({"type": "http.response.body", "body": content, "more_body": False})
        self._close(status < 500, answer)

    async def _relay_stream(self, upstream: UpstreamResponse, send: Send) -> None:
        a = self.attempt
        ok = upstream.status_code < 500
        try:
            self.started, self.status_code = True, upstream.status_code
            a.status = upstream.status_code
            await send({"type": "http.response.start", "status": upstream.status_code,
                        "headers": [*upstream.headers, *a.routed.headers(a.engine_rid)]})
            relayed = 0
            edit = StreamEdit(self.inbound.drops_usage, upstream.status_code,
                              self.inbound.drops_details(a.routed.entry.info.engine))
            try:
                async for chunk in upstream.aiter_raw():
                    if self.ttft is None:
                        self.ttft = self.state.clock() - self.inbound.t0
                        a.first_token(self.ttft)
                    self.tail = (self.tail + chunk)[-65536:]  # the engine's, usage included
                    chunk = edit.feed(chunk)
                    relayed += len(chunk)
                    if chunk:
                        await send({"type": "http.response.body", "body": chunk,
                                    "more_body": True})
                self.end = self.state.clock() - self.inbound.t0
                chunk = edit.flush()
                relayed += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamFailed as exc:
                ok = False
                a.upstream_error(UpstreamError.MID_STREAM)
                log.warning("worker %s failed mid-stream: %r", a.worker_id, exc)
                await send({"type": "http.response.body",
                            "body": sse_error(f"worker {a.worker_id} failed mid-stream: {exc!r}"),
                            "more_body": True})
            a.relayed(relayed)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await upstream.aclose()
        self._close(ok, last_sse_event(self.tail))
