"""The pool PD hand-off behind the router's HTTP front end (``--pd-mode pool``, ``docs/pd.md``).

``pool_handoff`` is called by ``router/request/handler.py::handle`` for every inference request
when the
router runs in pool mode. It learns each decode worker's KV capacity once (``/server_info``
``max_total_num_tokens``, so that the decode selection can refuse what does not fit), routes as
usual (``PolicyDriver``: the policy picks a prefill slot, ``DecodeSelector`` pairs and reserves a
decode slot, or the request is refused with 429 ``decode_kv`` / ``tbt_slo`` before anything is
sent), and then:

- the chosen worker is not a prefill-role worker (no decode slot paired): the ordinary
  :class:`router.request.relay.Forward`;
- otherwise :class:`PoolForward`, an ASGI response that runs ``PdOrchestrator`` (prefill with one
  output token on the prefill worker, pages written through to the pool, wait until the index
  sees them, then the client's request on the decode worker, retried on another decode worker if
  the first fails before answering) and relays the decode worker's answer, streamed or whole.
  The client disconnecting aborts both engine requests and releases the reservation.

One ``PdFront`` per ``RouterState`` (created on first use); its ``report()`` is the PD
utilisation report of ``/admin/stats`` (key ``pd``) and ``radix-global status``.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, cast

import httpx
import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from radix_global.types import PoolId, Role
from router.cluster.registry import WorkerEntry
from router.cluster.slots import worker_states
from router.keying.prompt import is_stream
from router.pd.native import native_util, native_util_if_used
from router.pd.orchestrator import IndexPoolProbe, PdFailed, PdOrchestrator, PdRejected, PdRun
from router.pd.protocol import PREFILL_RID_SUFFIX, PdConfig, PdMode, PdUtilization, cached_tokens_of
from router.request.relay import Forward, Routed
from router.routing.contract import RouteRequest, WorkerState
from router.state import RouterState
from router.transport.bodies import last_sse_event
from router.transport.proxy import ClientGone, forward_headers, sse_error, until_disconnect

log = logging.getLogger("radix_global.router.pd.protocol")

Route = Callable[[set[str]], "Routed | Response"]


class _RequestPoolProbe:
    """Pages of a request's prompt in the pool of the prefill worker that computed it (read from
    the global index, which follows each pool's store events)."""

    def __init__(self, state: RouterState) -> None:
        self.state = state
        self.pool_of: dict[str, PoolId] = {}  # request id -> pool of its prefill worker

    async def pages_present(self, req: RouteRequest) -> int:
        pool = self.pool_of.get(req.request_id)
        if pool is None:
            return len(req.page_keys)  # no pool to wait for
        view = self.state.index.view
        return await IndexPoolProbe(view, pool, self.state.clock).pages_present(req)


class PdFront:
    """The router's pool-mode PD state: orchestrator, learned decode capacities, report."""

    def __init__(self, state: RouterState) -> None:
        cfg = state.config
        self.state = state
        self.config = PdConfig.parse_ratio(cfg.pd_ratio, mode=PdMode.POOL,
                                           pool_ready_timeout_s=cfg.pd_pool_ready_timeout_s)
        tbt = state.routing.slo.tbt_slo_s  # from --pd-tbt-slo-s (router/state.py)
        self.probe = _RequestPoolProbe(state)
        self.orch = PdOrchestrator(state.proxy.client, self.config, selector=state.routing.decode,
                                   probe=self.probe, tbt_slo_s=tbt, clock=state.clock)
        self._asked: dict[str, float] = {}  # worker id -> when its capacity was last asked

    async def learn_capacity(self, entries: Iterable[WorkerEntry]) -> None:
        """Read each decode worker's KV capacity once (retried at most every 30 s on failure)."""
        capacity, now = self.orch.selector.capacity, self.state.clock()
        for e in entries:
            wid = e.worker_id
            recently = now - self._asked.get(wid, -1e9) < 30
            if e.info.role != Role.DECODE or wid in capacity or recently:
                continue
            self._asked[wid] = now
            try:
                resp = await self.state.proxy.client.get(e.info.url + "/server_info", timeout=5)
                info = resp.json() if resp.status_code == 200 else {}
                tokens = info.get("max_total_num_tokens") if isinstance(info, dict) else None
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("capacity of decode worker %s unknown: %r", wid, exc)
                continue
            if isinstance(tokens, int) and tokens > 0:
                capacity[wid] = tokens

    def report(self) -> dict[str, Any]:
        return {**_report_json(self.orch.util, self.state.clock()),
                "decode_capacity_tokens": dict(self.orch.selector.capacity),
                "failed_decode_workers": sorted(self.orch.failed)}


def _report_json(util: PdUtilization, now: float) -> dict[str, Any]:
    r = util.report(now)
    return {"mode": util.config.mode.value, "window_s": r.window_s,
            "configured_ratio": r.configured_ratio, "suggested_ratio": r.suggested_ratio,
            "prefill": {"workers": r.prefill.workers, "busy_s": round(r.prefill.busy_s, 3),
                        "utilization": round(r.prefill.utilization, 4)},
            "decode": {"workers": r.decode.workers, "busy_s": round(r.decode.busy_s, 3),
                       "utilization": round(r.decode.utilization, 4)},
            "rejected_before_prefill": r.rejected_before_prefill,
            "decode_retries": r.decode_retries}


_FRONTS: weakref.WeakKeyDictionary[RouterState, PdFront] = weakref.WeakKeyDictionary()


def front_of(state: RouterState) -> PdFront:
    front = _FRONTS.get(state)
    if front is None:
        front = _FRONTS[state] = PdFront(state)
    return front


def pd_util(state: RouterState) -> PdUtilization:
    """The utilisation tracker of the router's PD mode."""
    if state.config.pd_mode == PdMode.POOL:
        return front_of(state).orch.util
    return native_util(state)


def pd_report(state: RouterState) -> dict[str, Any] | None:
    """The PD utilisation report, or None when no PD request was seen yet."""
    front = _FRONTS.get(state)
    if front is not None:
        return front.report()
    native = native_util_if_used(state)
    return _report_json(native, state.clock()) if native is not None else None


async def pool_handoff(state: RouterState, req: RouteRequest, payload: dict[str, Any],
                       salt: str | None, kind: str, path: str, model: str,
                       headers: dict[str, str], t0: float, route: Route
                       ) -> Response | Forward:
    """Route ``req`` in pool mode (see the module docstring). The answer is an ASGI response:
    a plain one, a :class:`Forward`, or a :class:`PoolForward` (typed as Forward for the caller,
    which only calls it)."""
    front = front_of(state)
    await front.learn_capacity(state.registry.for_model(model))
    first = route(set())
    if isinstance(first, Response):
        return first
    if first.decision.decode_worker_id is None:
        return Forward(state, req, payload, salt, kind, path, model, first, headers,
                       stream=is_stream(payload), t0=t0, route=route)
    body = dict(payload)
    if salt is not None:
        body["cache_salt"] = salt
    return cast(Forward, PoolForward(front, first, req, body, kind, path, model, headers, t0))


class PoolForward:
    """ASGI response running one pool hand-off and relaying the decode worker's answer."""

    def __init__(self, front: PdFront, routed: Routed, req: RouteRequest, payload: dict[str, Any],
                 kind: str, path: str, model: str, headers: dict[str, str], t0: float) -> None:
        self.front, self.routed, self.req, self.payload = front, routed, req, payload
        self.kind, self.path, self.model, self.t0 = kind, path, model, t0
        self.headers = forward_headers(headers)
        self.stream = is_stream(payload)
        self.run: PdRun | None = None
        self.ok = False
        self.tail = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        st = self.front.state
        try:
            await until_disconnect(scope, receive, self._run(send))
        except ClientGone:
            st.metrics.client_aborts.inc()
            st.totals["client_aborts"] += 1
            await self._abort()
        finally:
            self._finish()

    async def _abort(self) -> None:
        proxy, rid = self.front.state.proxy, self.req.request_id
        await proxy.abort(self.routed.entry.info.url, rid + PREFILL_RID_SUFFIX)
        if self.run is not None:
            await proxy.abort(self.run.decode.url, rid)

    def _slots(self) -> tuple[WorkerState, list[WorkerState]]:
        slots = worker_states(self.front.state.registry.for_model(self.model))
        d = self.routed.decision
        prefill = next(s for s in slots if s.slot == (d.worker_id, d.dp_rank))
        return prefill, [s for s in slots if s.role == Role.DECODE]

    async def _run(self, send: Send) -> None:
        st, d = self.front.state, self.routed.decision
        prefill, decodes = self._slots()
        if prefill.pool_id:
            self.front.probe.pool_of[self.req.request_id] = PoolId(prefill.pool_id)
        try:
            self.run = self.front.orch.start(self.req, self.payload, self.kind, self.path,
                                             prefill, decodes, self.stream,
                                             chosen=d.decode_worker_id)
        except PdRejected as exc:
            await _json(send, 429, f"rejected before prefill: {exc.reason}", "rate_limit_exceeded",
                        {"retry-after": str(max(1, math.ceil(st.routing.slo.retry_after_s(0.0))))})
            return
        except PdFailed as exc:
            await _json(send, 502, str(exc), "upstream_error")
            return
        chunks = self.run.chunks()
        try:
            await self._relay(chunks, send)
        finally:
            await chunks.aclose()

    async def _relay(self, chunks: AsyncGenerator[bytes, None], send: Send) -> None:
        st, run = self.front.state, self.run
        assert run is not None
        try:
            first = await anext(chunks, None)
        except PdFailed as exc:
            await _json(send, run.status_code if run.status_code >= 400 else 502, str(exc),
                        "upstream_error")
            return
        st.routing.prefill_done(self.req.request_id, st.clock())
        media = "text/event-stream" if self.stream and run.status_code == 200 \
            else "application/json"
        await send({"type": "http.response.start", "status": run.status_code, "headers": [
            (b"content-type", media.encode()),
            (b"x-radix-worker", str(run.prefill.worker_id).encode()),
            (b"x-radix-decode-worker", str(run.decode.worker_id).encode()),
            (b"x-radix-prefix-tokens", str(self.routed.decision.prefix_tokens).encode()),
            (b"x-radix-request-id", self.req.request_id.encode())]})
        chunk = first
        try:
            while chunk is not None:
                self.tail = (self.tail + chunk)[-65536:]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await anext(chunks, None)
        except PdFailed as exc:  # the decode worker broke mid-answer: already in the stream
            log.warning("pool hand-off of %s broke: %s", self.req.request_id, exc)
            await send({"type": "http.response.body", "more_body": True,
                        "body": sse_error(str(exc)) if self.stream else b""})
            run.status_code = 502
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.ok = run.status_code < 500

    def _finish(self) -> None:
        st, rid = self.front.state, self.req.request_id
        st.routing.finished(rid, self.ok, st.clock())
        self.front.probe.pool_of.pop(rid, None)
        st.totals["pd_pool_ok" if self.ok else "pd_pool_failed"] += 1
        run = self.run
        if run is None:
            return
        stats = run.stats
        answer = run.answer if run.answer is not None else last_sse_event(self.tail)
        _, d_cached, d_storage = cached_tokens_of(answer)
        st.recent.append({
            "request_id": rid, "accepted": True, "pd": "pool", "ok": self.ok,
            "worker_id": stats.prefill_worker, "decode_worker_id": stats.decode_worker,
            "decode_attempts": list(stats.decode_attempts), "input_tokens": self.req.input_tokens,
            "prefill_s": stats.prefill_s, "pool_wait_s": stats.pool_wait_s,
            "pool_pages": stats.pool_pages, "prefill_cached_tokens": stats.prefill_cached_tokens,
            "decode_cached_tokens": d_cached, "decode_storage_tokens": d_storage,
            "ttft_s": stats.ttft_s})


async def _json(send: Send, status: int, message: str, kind: str,
                headers: dict[str, str] | None = None) -> None:
    body = msgspec.json.encode({"error": {"message": message, "type": kind, "code": status}})
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


__all__ = ["PdFront", "PoolForward", "front_of", "pd_report", "pd_util", "pool_handoff"]
