"""One started pool hand-off (:class:`PdRun`): step 3 and 4 of ``router/pd/orchestrator.py``,
after the decode worker was chosen and reserved there: the prefill-only request to the prefill
worker, the wait for its pages in the pool (``PdOrchestrator.wait_pool``), then the client's
request to the decode worker.

A decode worker failing before its first byte is retried on the next choice (up to
``decode_attempts``); after it, the stream ends with an error event. Every outcome releases the
decode reservation and the busy-time intervals (``chunks``'s ``finally``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, NamedTuple, Protocol

import msgspec

from radix_global.types import Role, WorkerId
from router.keying.request_body import RequestKind
from router.pd.protocol import (
    PdConfig,
    PdError,
    PdUtilization,
    cached_tokens_of,
    decode_step_body,
    prefill_only_body,
)
from router.routing.contract import RouteRequest, WorkerState
from router.routing.decode_select import DecodeSelector
from router.transport.bodies import json_or_none
from router.transport.errors import ErrorType, error_body, sse_error
from router.transport.proxy import UpstreamFailed, UpstreamResponse, UpstreamUnavailable

log = logging.getLogger("radix_global.router.pd")


class DataPlane(Protocol):
    """How requests reach workers (``router.transport.proxy.Proxy``). Both raise
    ``UpstreamUnavailable`` when the worker did not take the request (safe to retry elsewhere)
    and ``UpstreamFailed`` when it failed after it may have started."""

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """POST and read the whole answer."""

    async def open_stream(self, url: str, body: bytes, headers: dict[str, str]
                          ) -> UpstreamResponse:
        """POST and return at the answer's head; the caller reads and closes it."""


class Orchestrator(Protocol):
    """What a run uses of the ``PdOrchestrator`` that started it. Structural, so that imports
    run one way: ``router/pd/orchestrator.py`` builds runs and imports this module, never the
    other way round."""

    data: DataPlane
    config: PdConfig
    selector: DecodeSelector
    util: PdUtilization
    clock: Callable[[], float]
    on_refused: Callable[[WorkerId, BaseException], object]
    on_answered: Callable[[WorkerId], object]

    def pick_decode(self, req: RouteRequest, decodes: Sequence[WorkerState],
                    excluded: frozenset[str] | set[str] = frozenset()) -> WorkerState | None:
        """Choose and reserve a decode slot (None if none fits)."""

    async def wait_pool(self, req: RouteRequest) -> tuple[int | None, float | None]:
        """Wait until the prompt's full pages are in the pool: ``(pages, waited_s)``."""


class PdFailed(Exception):
    """The prefill step failed, or every decode attempt failed before answering."""


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

    def __init__(self, orch: Orchestrator, req: RouteRequest, payload: dict[str, Any],
                 kind: RequestKind, path: str, prefill: WorkerState, decode: WorkerState,
                 decodes: Sequence[WorkerState], stream: bool, headers: dict[str, str]) -> None:
        self.orch, self.req, self.payload, self.kind, self.path = orch, req, payload, kind, path
        self.prefill, self.decode, self.decodes, self.stream = prefill, decode, decodes, stream
        self.headers = headers
        self.status_code = 200
        self.answer: Any = None  # the decode worker's JSON (non-streamed)
        self._t0 = orch.clock()
        self._ttft: float | None = None
        self._attempts: list[WorkerId] = []
        self._prefill: tuple[float | None, float | None, int | None, Any] = (None, None, None, None)
        self._done = False
        self._decode_busy = True  # the orchestrator began the decode worker's busy interval

    @property
    def prefill_answer(self) -> Any:
        """The prefill worker's JSON answer (None before it, or when it was no JSON)."""
        return self._prefill[3]

    @property
    def stats(self) -> PdStats:
        prefill_s, wait_s, pages, pre_answer = self._prefill
        p_prompt, p_cached, _ = cached_tokens_of(pre_answer)
        _, d_cached, d_storage = cached_tokens_of(self.answer)
        return PdStats(self.orch.config.mode.value, self.prefill.worker_id,
                       self._attempts[-1] if self._attempts and self._done else None,
                       tuple(self._attempts), prefill_s, wait_s, pages, self._ttft,
                       p_prompt, p_cached, d_cached, d_storage)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        orch = self.orch
        try:
            await self._prefill_step()
            async for chunk in self._decode_with_retries():
                yield chunk
        finally:
            orch.selector.release(self.req.request_id)
            if self._decode_busy:
                orch.util.end(self.decode.worker_id, orch.clock())

    async def _prefill_step(self) -> None:
        orch, wid = self.orch, self.prefill.worker_id
        try:
            body = msgspec.json.encode(prefill_only_body(self.payload, self.kind,
                                                         self.req.request_id))
        except PdError as exc:  # a request the hand-off cannot take: the client's to fix
            self.status_code = 400
            raise PdFailed(str(exc)) from exc
        t = orch.clock()
        orch.util.begin(wid, Role.PREFILL, t)
        try:
            resp = await orch.data.post(self.prefill.url + self.path, body, self.headers)
        except UpstreamUnavailable as exc:
            orch.on_refused(wid, exc)
            raise PdFailed(f"prefill worker {wid}: {exc}") from exc
        except UpstreamFailed as exc:
            raise PdFailed(f"prefill worker {wid}: {exc}") from exc
        finally:
            orch.util.end(wid, orch.clock())
        orch.on_answered(wid)
        if resp.status_code != 200:
            self.status_code = resp.status_code
            raise PdFailed(f"prefill worker {wid} answered {resp.status_code}: "
                           f"{resp.content[:300].decode(errors='replace')}")
        prefill_s = orch.clock() - t
        answer = json_or_none(resp.content)
        pages, wait_s = await orch.wait_pool(self.req)
        self._prefill = (prefill_s, wait_s, pages, answer)

    async def _relay(self, decode: WorkerState) -> AsyncIterator[bytes]:
        """POST to the decode worker and yield its answer. Raises ``_Retryable`` if it failed
        before answering anything."""
        orch = self.orch
        body = msgspec.json.encode(decode_step_body(self.payload, self.req.request_id))
        try:
            resp = await orch.data.open_stream(decode.url + self.path, body, self.headers)
        except UpstreamUnavailable as exc:
            orch.on_refused(decode.worker_id, exc)
            raise _Retryable(f"{decode.worker_id}: {exc}") from exc
        except UpstreamFailed as exc:
            raise _Retryable(f"{decode.worker_id}: {exc}") from exc
        try:
            orch.on_answered(decode.worker_id)
            if resp.status_code >= 500:
                raise _Retryable(f"{decode.worker_id} answered {resp.status_code}")
            self.status_code = resp.status_code
            raw = b""
            async for chunk in resp.aiter_raw():
                if self._ttft is None:
                    self._ttft = orch.clock() - self._t0
                if not self.stream:
                    raw += chunk
                yield chunk
            if not self.stream and raw:
                self.answer = json_or_none(raw)
        except UpstreamFailed as exc:
            if self._ttft is None:
                raise _Retryable(f"{decode.worker_id}: {exc}") from exc
            raise PdFailed(f"decode worker {decode.worker_id} broke mid-answer: {exc}") from exc
        finally:
            await resp.aclose()

    async def _decode_with_retries(self) -> AsyncIterator[bytes]:
        orch, decode, excluded = self.orch, self.decode, set[str]()
        for attempt in range(orch.config.decode_attempts):
            self._attempts.append(decode.worker_id)
            self.decode = decode
            try:
                async for chunk in self._relay(decode):
                    yield chunk
                self._done = True
                return
            except _Retryable as exc:
                log.warning("decode attempt %d of %s failed: %s", attempt + 1,
                            self.req.request_id, exc)
                excluded.add(decode.worker_id)
                orch.util.end(decode.worker_id, orch.clock())
                self._decode_busy = False
                last = attempt + 1 >= orch.config.decode_attempts
                nxt = None if last else orch.pick_decode(self.req, self.decodes, excluded)
                if nxt is None:
                    break
                orch.util.decode_retries += 1
                orch.util.begin(nxt.worker_id, Role.DECODE, orch.clock())
                self._decode_busy = True
                decode = nxt
        self.status_code = 502
        message = f"no decode worker answered for {self.req.request_id} ({self._attempts})"
        yield sse_error(message) if self.stream else error_body(502, message, ErrorType.UPSTREAM)


class _Retryable(Exception):
    pass
