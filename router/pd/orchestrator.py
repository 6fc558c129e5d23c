"""The pool prefill/decode hand-off over HTTP: reserve a decode worker, run the prefill, hand off.

``PdOrchestrator.start(...)`` does, in this order:

1. Decode selection *before anything runs*: ``DecodeSelector.choose`` (KV headroom minus this
   router's reservations, running batch, predicted TBT against the SLO). No decode worker fits ->
   :class:`PdRejected` (HTTP 429): the request is refused before any prefill compute is spent.
2. Reserve the chosen decode worker's KV for the request (released when the request ends, in
   every outcome), so a finished prefill always has somewhere to go.
3. POST the prompt with one output token to the prefill worker (its pages are written through
   to the L3 pool), wait until ``PoolProbe`` sees the prompt's pages in the pool (or
   ``pool_ready_timeout_s``), then POST the client's request to the decode worker.
4. A decode worker that fails before answering (connection refused, 5xx; e.g. killed) is
   excluded for this request, its reservation moved to the next choice, and the decode step
   retried there (up to ``decode_attempts``): the prompt is still in the pool, so nothing is
   prefilled twice. After the first byte has been relayed a failure ends the stream with an
   error event.

Requests go through the router's data plane (:class:`DataPlane`, the router's ``Proxy``), and
every refused connection is reported through ``on_refused`` (the router's health checking, which
removes the worker and brings it back when it answers again), every answer through
``on_answered``: a worker that failed once is not excluded for the router's life.

Native PD (SGLang's own transfer: both halves at once with bootstrap fields) needs no
orchestration: the HTTP relay sends it (``router/request/relay.py``).

The result is a :class:`PdRun` (``router/pd/run.py``: steps 3 and 4) whose ``chunks()`` relays
the decode answer (SSE passed through when streaming) and whose ``stats`` hold the timings and
cache numbers of both steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from radix_global.types import PoolId, Role, WorkerId
from router.keying.request_body import RequestKind
from router.pd.protocol import PdConfig, PdError, PdMode, PdUtilization
from router.pd.run import DataPlane, PdFailed, PdRun
from router.routing.contract import IndexView, RejectReason, RouteRequest, WorkerState
from router.routing.decode_select import DecodeSelector

__all__ = ["DataPlane", "IndexPoolProbe", "PdFailed", "PdOrchestrator", "PdRejected", "PdRun",
           "PoolProbe"]


class PdRejected(Exception):
    """No decode worker can take the request (``TBT_SLO``, ``DECODE_KV`` or ``NO_WORKERS``);
    raised before the prefill starts."""

    def __init__(self, reason: RejectReason, predicted_tbt_s: float | None = None) -> None:
        super().__init__(f"rejected before prefill: {reason}")
        self.reason, self.predicted_tbt_s = reason, predicted_tbt_s


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


def _ignore(worker_id: WorkerId, *exc: BaseException) -> None:
    pass


class PdOrchestrator:
    """Runs pool hand-offs. ``data``: the router's data plane; ``selector`` is shared with the
    routing core (it holds the decode reservations); ``probe`` tells when the prompt is in the
    pool (None: do not wait); ``on_refused(worker, exc)`` / ``on_answered(worker)``: what a
    worker did, for health checking."""

    def __init__(self, data: DataPlane, config: PdConfig,
                 selector: DecodeSelector | None = None, probe: PoolProbe | None = None,
                 tbt_slo_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 on_refused: Callable[[WorkerId, BaseException], object] = _ignore,
                 on_answered: Callable[[WorkerId], object] = _ignore) -> None:
        if config.mode != PdMode.POOL:
            raise PdError("the orchestrator runs pool hand-offs; native PD is the relay's")
        self.data, self.config = data, config
        self.selector = selector or DecodeSelector()
        self.probe, self.tbt_slo_s, self.clock, self.sleep = probe, tbt_slo_s, clock, sleep
        self.on_refused, self.on_answered = on_refused, on_answered
        self.util = PdUtilization(config)
        self._last_reject: tuple[RejectReason, float | None] = (RejectReason.NO_WORKERS, None)

    def pick_decode(self, req: RouteRequest, decodes: Sequence[WorkerState],
                    excluded: frozenset[str] | set[str] = frozenset()) -> WorkerState | None:
        """Choose and reserve a decode slot (None if none fits)."""
        live = [d._replace(accepting=d.accepting and d.worker_id not in excluded)
                for d in decodes]
        tbt = req.tbt_slo_s if req.tbt_slo_s is not None else self.tbt_slo_s
        choice = self.selector.choose(req, live, tbt)
        if not choice.accepted or choice.worker_id is None:
            self._last_reject = (choice.reason or RejectReason.NO_WORKERS, choice.predicted_tbt_s)
            return None
        self.selector.reserve(req.request_id, (choice.worker_id, choice.dp_rank),
                              choice.reserve_tokens)
        return next(d for d in live if d.slot == (choice.worker_id, choice.dp_rank))

    def start(self, req: RouteRequest, payload: dict[str, Any], kind: RequestKind, path: str,
              prefill: WorkerState, decodes: Sequence[WorkerState], stream: bool,
              chosen: WorkerId | None = None, headers: dict[str, str] | None = None) -> PdRun:
        """Select and reserve the decode worker (or raise :class:`PdRejected`), nothing sent.

        ``chosen``: a decode worker the routing core already picked (``Decision.
        decode_worker_id``, reserved by ``PolicyDriver`` in the same selector); it is used as
        is, unless it is not accepting any more. ``headers``: passed on to both workers."""
        if req.namespace != prefill.namespace:
            raise PdFailed(f"prefill worker {prefill.worker_id} serves {prefill.namespace}, "
                           f"not {req.namespace}")
        self._last_reject = (RejectReason.NO_WORKERS, None)
        decode = next((d for d in decodes if d.worker_id == chosen and d.accepting), None)
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
        return PdRun(self, req, payload, kind, path, prefill, decode, decodes, stream,
                     headers or {"content-type": "application/json"})

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

