"""The pool PD hand-off of one request (``--pd-mode pool``, ``docs/pd.md``): an ASGI response
that runs ``PdOrchestrator`` (prefill with one output token on the prefill worker, pages written
through to the pool, wait until the index sees them, then the client's request on the decode
worker, retried on another decode worker if the first fails before answering) and relays the
decode worker's answer, streamed or whole. The client disconnecting aborts both engine requests
and releases the reservation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncGenerator

from starlette.types import Receive, Scope, Send

from radix_global.types import PoolId, Role
from router.cluster.slots import worker_states
from router.pd.orchestrator import PdFailed, PdRejected, PdRun
from router.pd.pool_front import PdFront
from router.pd.protocol import PREFILL_RID_SUFFIX, cached_tokens_of
from router.request.booking import book_answer
from router.request.finish import Outcome, client_gone, finish
from router.request.inbound import Inbound
from router.request.route import Routed
from router.routing.contract import WorkerState
from router.state import RouterState
from router.transport.bodies import last_sse_event
from router.transport.errors import ErrorType, HttpError, send_failure, sse_error
from router.transport.openai_stream import StreamEdit
from router.transport.proxy import ClientGone, until_disconnect

log = logging.getLogger("radix_global.router.pd")


class PoolForward:
    """ASGI response running one pool hand-off and relaying the decode worker's answer."""

    def __init__(self, state: RouterState, front: PdFront, inbound: Inbound,
                 routed: Routed) -> None:
        self.state, self.front, self.inbound, self.routed = state, front, inbound, routed
        self.run: PdRun | None = None
        self.ok = False
        self.started = False  # the answer's head was sent to the client
        self.status_code = 499  # what the client got (499: nothing, it left first)
        self.tail = b""
        self.ttft_s: float | None = None  # the decode's first byte, after the request arrived
        self.end_s: float | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(scope, receive, self._guarded(send))
        except ClientGone:
            client_gone(self.state)
            await self._abort()
        finally:
            self._finish()

    async def _guarded(self, send: Send) -> None:
        """A failure inside the hand-off is a clean answer: 500 before the head, the end after."""
        try:
            await self._run(send)
        except ClientGone:
            raise
        except Exception as exc:
            log.exception("pool hand-off of %s failed", self.inbound.req.request_id)
            if not self.started:
                self.status_code = 500
            await send_failure(send, self.started, self.inbound.stream, exc)

    async def _abort(self) -> None:
        proxy, inbound = self.state.proxy, self.inbound
        rid = inbound.req.request_id
        for engine_rid in inbound.engine_rids(rid + PREFILL_RID_SUFFIX):
            await proxy.abort(self.routed.entry.info.url, engine_rid)
        if self.run is not None:
            for engine_rid in inbound.engine_rids(rid):
                await proxy.abort(self.run.decode.url, engine_rid)

    def _slots(self) -> tuple[WorkerState, list[WorkerState]]:
        slots = worker_states(self.state.registry.for_model(self.inbound.model),
                              view=self.state.view)
        d = self.routed.decision
        prefill = next((s for s in slots if s.slot == (d.worker_id, d.dp_rank)), None)
        if prefill is None:
            raise PdFailed(f"prefill worker {d.worker_id} left")
        return prefill, [s for s in slots if s.role == Role.DECODE]

    async def _run(self, send: Send) -> None:
        try:
            self.run = self._start()
        except HttpError as refusal:
            await self._refuse(send, refusal)
            return
        chunks = self.run.chunks()
        try:
            await self._relay(chunks, send)
        finally:
            await chunks.aclose()

    async def _refuse(self, send: Send, refusal: HttpError) -> None:
        self.started, self.status_code = True, refusal.status
        await refusal.send(send)

    def _start(self) -> PdRun:
        """The hand-off, begun; raises the refusal when it cannot begin."""
        st, d, inbound = self.state, self.routed.decision, self.inbound
        if inbound.batch is not None:  # one decode stream per hand-off: a batch has many
            raise HttpError(400, "the pool hand-off takes one prompt per request; send the "
                            "batch's prompts as separate requests")
        try:
            prefill, decodes = self._slots()
        except PdFailed as exc:
            raise HttpError(503, str(exc), ErrorType.UNAVAILABLE) from exc
        if prefill.pool_id:
            self.front.probe.pool_of[inbound.req.request_id] = PoolId(prefill.pool_id)
        payload = {**inbound.payload(), **inbound.engine_fields(inbound.req.request_id)}
        try:
            return self.front.orch.start(inbound.req, payload, inbound.kind, inbound.path,
                                         prefill, decodes, inbound.stream,
                                         chosen=d.decode_worker_id, headers=inbound.headers)
        except PdRejected as exc:
            retry = max(1, math.ceil(st.routing.slo.retry_after_s(0.0)))
            raise HttpError(429, f"rejected before prefill: {exc.reason}", ErrorType.RATE_LIMIT,
                            {"retry-after": str(retry)}) from exc
        except PdFailed as exc:
            raise HttpError(502, str(exc), ErrorType.UPSTREAM) from exc

    async def _relay(self, chunks: AsyncGenerator[bytes, None], send: Send) -> None:
        st, run, inbound = self.state, self.run, self.inbound
        assert run is not None
        try:
            first = await anext(chunks, None)
        except PdFailed as exc:
            status = run.status_code if run.status_code >= 400 else 502
            await self._refuse(send, HttpError(status, str(exc), ErrorType.INVALID_REQUEST
                                               if status == 400 else ErrorType.UPSTREAM))
            return
        st.routing.prefill_done(inbound.req.request_id, st.clock())
        self.ttft_s = st.clock() - inbound.t0
        media = "text/event-stream" if inbound.stream and run.status_code == 200 \
            else "application/json"
        self.started, self.status_code = True, run.status_code
        await send({"type": "http.response.start", "status": run.status_code, "headers": [
            (b"content-type", media.encode()),
            (b"x-radix-decode-worker", str(run.decode.worker_id).encode()),
            *self.routed.headers(inbound.req.request_id)]})
        chunk = first
        edit = StreamEdit(inbound.drops_usage, run.status_code, inbound.drops_details("sglang")) \
            if inbound.stream else None
        try:
            while chunk is not None:
                self.tail = (self.tail + chunk)[-65536:]
                body = edit.feed(chunk) if edit is not None else chunk
                await send({"type": "http.response.body", "body": body, "more_body": True})
                chunk = await anext(chunks, None)
            if edit is not None:
                await send({"type": "http.response.body", "body": edit.flush(),
                            "more_body": True})
        except PdFailed as exc:  # the decode worker broke mid-answer: already in the stream
            log.warning("pool hand-off of %s broke: %s", inbound.req.request_id, exc)
            await send({"type": "http.response.body", "more_body": True,
                        "body": sse_error(str(exc)) if inbound.stream else b""})
            run.status_code = 502
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.end_s = st.clock() - inbound.t0
        self.ok = run.status_code < 500

    def _finish(self) -> None:
        rid, run = self.inbound.req.request_id, self.run
        self.front.probe.pool_of.pop(rid, None)
        record: dict[str, object] = {"pd": "pool", "input_tokens": self.inbound.req.input_tokens}
        answer = None
        if run is not None:
            stats = run.stats
            answer = run.answer if run.answer is not None else last_sse_event(self.tail)
            _, d_cached, d_storage = cached_tokens_of(answer)
            record.update({
                "worker_id": stats.prefill_worker, "decode_worker_id": stats.decode_worker,
                "decode_attempts": list(stats.decode_attempts), "prefill_s": stats.prefill_s,
                "pool_wait_s": stats.pool_wait_s, "pool_pages": stats.pool_pages,
                "prefill_cached_tokens": stats.prefill_cached_tokens,
                "decode_cached_tokens": d_cached, "decode_storage_tokens": d_storage,
                "ttft_s": stats.ttft_s})
        book_answer(self.state, self.inbound, self.routed, self.ok and self.status_code == 200,
                    None if run is None else run.prefill_answer, answer, self.ttft_s,
                    self.end_s, handoff=True)
        finish(self.state, self.inbound, self.ok,
               Outcome.PD_POOL_OK if self.ok else Outcome.PD_POOL_FAILED, record)
