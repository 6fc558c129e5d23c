"""Prefill/decode orchestration over HTTP: reserve a decode worker, run the prefill, hand off.

``PdOrchestrator.start(...)`` does, in this order:

1. Decode selection *before anything runs*: ``DecodeSelector.choose`` (KV headroom minus this
   router's reservations, running batch, predicted TBT against the SLO). No decode worker fits ->
   :class:`PdRejected` (HTTP 429): the request is refused before any prefill compute is spent.
2. Reserve the chosen decode worker's KV for the request (released when the request ends, in
   every outcome), so a finished prefill always has somewhere to go.
3. The hand-off of ``PdConfig.mode``:
   - ``pool``: POST the prompt with one output token to the prefill worker (its pages are written
     through to the L3 pool), wait until ``PoolProbe`` sees the prompt's pages in the pool (or
     ``pool_ready_timeout_s``), then POST the client's request to the decode worker.
   - ``native``: POST the client's request plus SGLang's bootstrap fields to both workers at once
     (``router/pd/protocol.py::native_body``); the decode worker's answer is the client's.
4. A decode worker that fails before answering (connection refused/reset, 5xx; e.g. killed) is
   excluded, its reservation moved to the next choice, and the decode step retried there (up to
   ``decode_attempts``): in ``pool`` mode the prompt is still in the pool, so nothing is prefilled
   twice. After the first byte has been relayed a failure ends the stream with an error event.

The result is a :class:`PdRun` whose ``chunks()`` relays the decode answer (SSE passed through
when streaming) and whose ``stats`` hold the timings and cache numbers of both steps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

import httpx

from radix_global.types import Namespace, PoolId, Role, WorkerId
from router.pd.protocol import (
    PdConfig,
    PdMode,
    PdUtilization,
    cached_tokens_of,
    decode_body,
    native_body,
    new_bootstrap_room,
    prefill_only_body,
)
from router.routing.contract import IndexView, RouteRequest, WorkerState
from router.routing.decode_select import DecodeSelector
from router.transport.proxy import sse_error

log = logging.getLogger("radix_global.router.pd.protocol")


class PdRejected(Exception):
    """No decode worker can take the request (reason: ``tbt_slo`` | ``decode_kv`` | ``no_workers``);
    raised before the prefill starts."""

    def __init__(self, reason: str, predicted_tbt_s: float | None = None) -> None:
        super().__init__(f"rejected before prefill: {reason}")
        self.reason, self.predicted_tbt_s = reason, predicted_tbt_s


class PdFailed(Exception):
    """The prefill step failed, or every decode attempt failed before answering."""


class PoolProbe(Protocol):
    async def pages_present(self, req: RouteRequest) -> int:
        """Leading pages of ``req``'s prompt now in the pool."""


class IndexPoolProbe:
    """Reads the pool's holdings from the global index (fed by the pool backend's events)."""

    def __init__(self, index: IndexView, pool_id: PoolId,
                 clock: Callable[[], float] = time.time) -> None:
        self.index, self.pool_id, self.clock = index, pool_id, clock

    async def pages_present(self, req: RouteRequest) -> int:
        match = self.index.match(req.namespace, req.page_keys, self.clock())
        return max((m.pool for (holder, _), m in match.matched.items()
                    if holder == self.pool_id), default=0)


class PdStats(NamedTuple):
    mode: str
    prefill_worker: WorkerId
    decode_worker: WorkerId | None  # the one that answered
    decode_attempts: tuple[WorkerId, ...]
    prefill_s: float | None  # pool mode: the prefill step's wall time
    pool_wait_s: float | None  # pool mode: waiting for the pages to reach the pool
    pool_pages: int | None  # pages found in the pool before the decode request
    ttft_s: float | None  # start -> first decode byte
    prefill_prompt_tokens: int | None
    prefill_cached_tokens: int | None  # what the prefill worker did not compute
    decode_cached_tokens: int | None
    decode_storage_tokens: int | None  # what the decode worker fetched from the pool


class PdRun:
    """One started disaggregated request; iterate ``chunks()`` exactly once."""

    def __init__(self, orch: PdOrchestrator, req: RouteRequest, payload: dict[str, Any],
                 kind: str, path: str, prefill: WorkerState, decode: WorkerState,
                 decodes: Sequence[WorkerState], stream: bool) -> None:
        self.orch, self.req, self.payload, self.kind, self.path = orch, req, payload, kind, path
        self.prefill, self.decode, self.decodes, self.stream = prefill, decode, decodes, stream
        self.status_code = 200
        self.answer: Any = None  # the decode worker's JSON (non-streamed)
        self._t0 = orch.clock()
        self._ttft: float | None = None
        self._attempts: list[WorkerId] = []
        self._prefill: tuple[float | None, float | None, int | None, Any] = (None, None, None, None)
        self._done = False

    @property
    def stats(self) -> PdStats:
        prefill_s, wait_s, pages, pre_answer = self._prefill
        p_prompt, p_cached, _ = cached_tokens_of(pre_answer)
        _, d_cached, d_storage = cached_tokens_of(self.answer)
        return PdStats(self.orch.config.mode.value, self.prefill.worker_id,
                       self._attempts[-1] if self._attempts and self._done else None,
                       tuple(self._attempts), prefill_s, wait_s, pages, self._ttft,
                       p_prompt, p_cached, d_cached, d_storage)

    def cancel(self) -> None:
        """Give the reservation back without running (client gone before the start)."""
        if self.orch.selector.release(self.req.request_id):
            self.orch.util.end(self.decode.worker_id, self.orch.clock())

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        orch = self.orch
        try:
            if orch.config.mode == PdMode.POOL:
                await self._pool_prefill()
                async for chunk in self._decode_with_retries(self._pool_decode):
                    yield chunk
            else:
                async for chunk in self._decode_with_retries(self._native):
                    yield chunk
        finally:
            orch.selector.release(self.req.request_id)
            orch.util.end(self.decode.worker_id, orch.clock())

    async def _pool_prefill(self) -> None:
        orch = self.orch
        body = prefill_only_body(self.payload, self.kind, self.req.request_id)
        t = orch.clock()
        orch.util.begin(self.prefill.worker_id, Role.PREFILL, t)
        try:
            resp = await orch.client.post(self.prefill.url + self.path, json=body)
        except httpx.HTTPError as exc:
            raise PdFailed(f"prefill worker {self.prefill.worker_id}: {exc!r}") from exc
        finally:
            orch.util.end(self.prefill.worker_id, orch.clock())
        if resp.status_code != 200:
            self.status_code = resp.status_code
            raise PdFailed(f"prefill worker {self.prefill.worker_id} answered "
                           f"{resp.status_code}: {resp.text[:300]}")
        prefill_s = orch.clock() - t
        answer = resp.json()
        pages, wait_s = await orch.wait_pool(self.req)
        self._prefill = (prefill_s, wait_s, pages, answer)

    async def _pool_decode(self, decode: WorkerState) -> AsyncIterator[bytes]:
        body = decode_body(self.payload, self.kind, self.req.request_id)
        async for chunk in self._relay(decode, body):
            yield chunk

    async def _native(self, decode: WorkerState) -> AsyncIterator[bytes]:
        orch = self.orch
        port = orch.bootstrap_ports.get(self.prefill.worker_id)
        if port is None:
            raise PdFailed(f"prefill worker {self.prefill.worker_id} has no bootstrap port")
        body = native_body(self.payload, self.prefill.url, port, new_bootstrap_room())
        body.pop("rid", None)  # the two halves must not share an engine rid

        async def prefill_side() -> Any:
            orch.util.begin(self.prefill.worker_id, Role.PREFILL, orch.clock())
            try:
                resp = await orch.client.post(self.prefill.url + self.path,
                                              json={**body, "stream": False})
                return resp.json() if resp.status_code == 200 else None
            finally:
                orch.util.end(self.prefill.worker_id, orch.clock())

        side = asyncio.create_task(prefill_side())
        try:
            async for chunk in self._relay(decode, body):
                yield chunk
        finally:
            try:
                answer = await asyncio.wait_for(side, timeout=5.0)
            except (TimeoutError, httpx.HTTPError, ValueError):
                side.cancel()
                answer = None
            self._prefill = (None, None, None, answer)

    async def _relay(self, decode: WorkerState, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """POST to the decode worker and yield its answer. Raises ``_Retryable`` if it failed
        before answering anything."""
        orch = self.orch
        try:
            async with orch.client.stream("POST", decode.url + self.path, json=body) as resp:
                if resp.status_code >= 500:
                    raise _Retryable(f"{decode.worker_id} answered {resp.status_code}")
                self.status_code = resp.status_code
                raw = b""
                async for chunk in resp.aiter_bytes():
                    if self._ttft is None:
                        self._ttft = orch.clock() - self._t0
                    if not self.stream:
                        raw += chunk
                    yield chunk
                if not self.stream and raw:
                    try:
                        self.answer = json.loads(raw)
                    except ValueError:
                        self.answer = None
        except httpx.HTTPError as exc:
            if self._ttft is None:
                raise _Retryable(f"{decode.worker_id}: {exc!r}") from exc
            raise PdFailed(f"decode worker {decode.worker_id} broke mid-answer: {exc!r}") from exc

    async def _decode_with_retries(
        self, step: Callable[[WorkerState], AsyncIterator[bytes]]
    ) -> AsyncIterator[bytes]:
        orch, decode, excluded = self.orch, self.decode, set[str]()
        for attempt in range(orch.config.decode_attempts):
            self._attempts.append(decode.worker_id)
            self.decode = decode
            try:
                async for chunk in step(decode):
                    yield chunk
                self._done = True
                return
            except _Retryable as exc:
                log.warning("decode attempt %d of %s failed: %s", attempt + 1,
                            self.req.request_id, exc)
                excluded.add(decode.worker_id)
                orch.worker_failed(decode.worker_id)
                orch.util.end(decode.worker_id, orch.clock())
                nxt = orch.pick_decode(self.req, self.decodes, excluded)
                if nxt is None:
                    break
                orch.util.decode_retries += 1
                orch.util.begin(nxt.worker_id, Role.DECODE, orch.clock())
                decode = nxt
        self.status_code = 502
        message = f"no decode worker answered for {self.req.request_id} ({self._attempts})"
        if self.stream:
            yield sse_error(message)
        else:
            yield json.dumps({"error": {"message": message, "type": "upstream_error",
                                        "code": 502}}).encode()


class _Retryable(Exception):
    pass


class PdOrchestrator:
    """Runs disaggregated requests. ``selector`` is shared with the routing core (it holds the
    decode reservations); ``bootstrap_ports`` maps prefill workers to their SGLang bootstrap port
    (native mode); ``probe`` tells when the prompt is in the pool (pool mode; None: do not wait)."""

    def __init__(self, client: httpx.AsyncClient, config: PdConfig,
                 selector: DecodeSelector | None = None, probe: PoolProbe | None = None,
                 bootstrap_ports: dict[WorkerId, int] | None = None,
                 tbt_slo_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.client, self.config = client, config
        self.selector = selector or DecodeSelector()
        self.probe, self.bootstrap_ports = probe, dict(bootstrap_ports or {})
        self.tbt_slo_s, self.clock, self.sleep = tbt_slo_s, clock, sleep
        self.util = PdUtilization(config)
        self.failed: set[WorkerId] = set()
        self._last_reject: tuple[str, float | None] = ("no_workers", None)

    def pick_decode(self, req: RouteRequest, decodes: Sequence[WorkerState],
                    excluded: frozenset[str] | set[str] = frozenset()) -> WorkerState | None:
        """Choose and reserve a decode slot (None if none fits)."""
        live = [d._replace(accepting=d.accepting and d.worker_id not in excluded
                           and d.worker_id not in self.failed) for d in decodes]
        tbt = req.tbt_slo_s if req.tbt_slo_s is not None else self.tbt_slo_s
        choice = self.selector.choose(req, live, tbt)
        if not choice.accepted or choice.worker_id is None:
            self._last_reject = (choice.reason, choice.predicted_tbt_s)
            return None
        self.selector.reserve(req.request_id, (choice.worker_id, choice.dp_rank),
                              choice.reserve_tokens)
        return next(d for d in live if d.slot == (choice.worker_id, choice.dp_rank))

    def worker_failed(self, worker_id: WorkerId) -> None:
        """Stop choosing a decode worker that failed (until ``worker_recovered``)."""
        self.failed.add(worker_id)
        self.selector.forget_worker(worker_id)

    def worker_recovered(self, worker_id: WorkerId) -> None:
        self.failed.discard(worker_id)

    def start(self, req: RouteRequest, payload: dict[str, Any], kind: str, path: str,
              prefill: WorkerState, decodes: Sequence[WorkerState], stream: bool,
              chosen: WorkerId | None = None) -> PdRun:
        """Select and reserve the decode worker (or raise :class:`PdRejected`), nothing sent.

        ``chosen``: a decode worker the routing core already picked (``Decision.
        decode_worker_id``, reserved by ``PolicyDriver`` in the same selector); it is used as
        is, unless it failed meanwhile."""
        if req.namespace != prefill.namespace:
            raise PdFailed(f"prefill worker {prefill.worker_id} serves {prefill.namespace}, "
                           f"not {req.namespace}")
        self._last_reject = ("no_workers", None)
        decode = next((d for d in decodes if d.worker_id == chosen and d.accepting
                       and d.worker_id not in self.failed), None)
        if decode is not None:
            self.selector.reserve(req.request_id, decode.slot, self.selector.needed_tokens(req))
        else:
            decode = self.pick_decode(req, decodes)
        if decode is None:
            self.util.rejected_before_prefill += 1
            raise PdRejected(*self._last_reject)
        self.util.known_workers([(prefill.worker_id, Role.PREFILL)]
                                + [(d.worker_id, Role.DECODE) for d in decodes])
        self.util.begin(decode.worker_id, Role.DECODE, self.clock())
        return PdRun(self, req, payload, kind, path, prefill, decode, decodes, stream)

    async def wait_pool(self, req: RouteRequest) -> tuple[int | None, float | None]:
        """Wait until the prompt's full pages are in the pool: ``(pages, waited_s)``."""
        if self.probe is None or not req.page_keys:
            return None, None
        t0, want = self.clock(), len(req.page_keys)
        pages = await self.probe.pages_present(req)
        while pages < want and self.clock() - t0 < self.config.pool_ready_timeout_s:
            await self.sleep(self.config.pool_ready_poll_s)
            pages = await self.probe.pages_present(req)
        return pages, self.clock() - t0


def decode_states(entries: Sequence[tuple[WorkerId, str, Namespace]],
                  headroom: dict[WorkerId, int] | None = None,
                  running: dict[WorkerId, int] | None = None) -> list[WorkerState]:
    """Decode slots from ``(worker_id, url, namespace)`` plus engine-reported load (tests, CLI)."""
    return [WorkerState(worker_id=w, namespace=ns, role=Role.DECODE, url=url,
                        kv_headroom_tokens=(headroom or {}).get(w),
                        running=(running or {}).get(w))
            for w, url, ns in entries]
