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
from router.request.finish import finish
from router.request.inbound import Inbound
from router.request.route import Routed
from router.routing.contract import WorkerState
from router.state import RouterState
from router.transport.bodies import last_sse_event
from router.transport.errors import ErrorType, send_error, sse_error
from router.transport.proxy import ClientGone, until_disconnect

log = logging.getLogger("radix_global.router.pd")


class PoolForward:
    """ASGI response running one pool hand-off and relaying the decode worker's answer."""

    def __init__(self, state: RouterState, front: PdFront, inbound: Inbound,
                 routed: Routed) -> None:
        self.state, self.front, self.inbound, self.routed = state, front, inbound, routed
        self.run: PdRun | None = None
        self.ok = False
        self.tail = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        st = self.state
        try:
            await until_disconnect(scope, receive, self._run(send))
        except ClientGone:
            st.metrics.client_aborts.inc()
            st.totals["client_aborts"] += 1
            await self._abort()
        finally:
            self._finish()

    async def _abort(self) -> None:
        proxy, rid = self.state.proxy, self.inbound.req.request_id
        await proxy.abort(self.routed.entry.info.url, rid + PREFILL_RID_SUFFIX)
        if self.run is not None:
            await proxy.abort(self.run.decode.url, rid)

    def _slots(self) -> tuple[WorkerState, list[WorkerState]]:
        slots = worker_states(self.state.registry.for_model(self.inbound.model))
        d = self.routed.decision
        prefill = next(s for s in slots if s.slot == (d.worker_id, d.dp_rank))
        return prefill, [s for s in slots if s.role == Role.DECODE]

    async def _run(self, send: Send) -> None:
        st, d, inbound = self.state, self.routed.decision, self.inbound
        prefill, decodes = self._slots()
        if prefill.pool_id:
            self.front.probe.pool_of[inbound.req.request_id] = PoolId(prefill.pool_id)
        payload = {**inbound.payload, **inbound.engine_fields(inbound.req.request_id)}
        try:
            self.run = self.front.orch.start(inbound.req, payload, inbound.kind, inbound.path,
                                             prefill, decodes, inbound.stream,
                                             chosen=d.decode_worker_id, headers=inbound.headers)
        except PdRejected as exc:
            retry = max(1, math.ceil(st.routing.slo.retry_after_s(0.0)))
            await send_error(send, 429, f"rejected before prefill: {exc.reason}",
                             ErrorType.RATE_LIMIT, {"retry-after": str(retry)})
            return
        except PdFailed as exc:
            await send_error(send, 502, str(exc), ErrorType.UPSTREAM)
            return
        chunks = self.run.chunks()
        try:
            await self._relay(chunks, send)
        finally:
            await chunks.aclose()

    async def _relay(self, chunks: AsyncGenerator[bytes, None], send: Send) -> None:
        st, run, inbound = self.state, self.run, self.inbound
        assert run is not None
        try:
            first = await anext(chunks, None)
        except PdFailed as exc:
            await send_error(send, run.status_code if run.status_code >= 400 else 502, str(exc),
                             ErrorType.UPSTREAM)
            return
        st.routing.prefill_done(inbound.req.request_id, st.clock())
        media = "text/event-stream" if inbound.stream and run.status_code == 200 \
            else "application/json"
        await send({"type": "http.response.start", "status": run.status_code, "headers": [
            (b"content-type", media.encode()),
            (b"x-radix-worker", str(run.prefill.worker_id).encode()),
            (b"x-radix-decode-worker", str(run.decode.worker_id).encode()),
            (b"x-radix-prefix-tokens", str(self.routed.decision.prefix_tokens).encode()),
            (b"x-radix-request-id", inbound.req.request_id.encode())]})
        chunk = first
        try:
            while chunk is not None:
                self.tail = (self.tail + chunk)[-65536:]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await anext(chunks, None)
        except PdFailed as exc:  # the decode worker broke mid-answer: already in the stream
            log.warning("pool hand-off of %s broke: %s", inbound.req.request_id, exc)
            await send({"type": "http.response.body", "more_body": True,
                        "body": sse_error(str(exc)) if inbound.stream else b""})
            run.status_code = 502
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.ok = run.status_code < 500

    def _finish(self) -> None:
        rid, run = self.inbound.req.request_id, self.run
        self.front.probe.pool_of.pop(rid, None)
        record: dict[str, object] = {"pd": "pool", "input_tokens": self.inbound.req.input_tokens}
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
        finish(self.state, self.inbound, self.ok, "pd_pool_ok" if self.ok else "pd_pool_failed",
               record)
