"""Native PD (SGLang's own disaggregation) in the relay: the prefill half of one routed attempt.

The relay sends the client's request to the prefill and the decode worker at once, with the
bootstrap fields of ``router.pd.protocol.native_body``; the client gets the decode worker's
answer. :class:`PrefillHalf` is the other half: both workers count as busy in the utilisation
report (``RouterState.pd_util``) from the send until their answers, a failed prefill aborts
the decode half (it would wait for KV that never comes), and the prefill's cache numbers are
kept for the request's record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec

from radix_global.types import Role, WorkerId
from router.cluster.registry import WorkerEntry
from router.keying.prompt import engine_cached_tokens
from router.pd.protocol import PREFILL_RID_SUFFIX
from router.state import RouterState
from router.transport.proxy import UpstreamResponse

log = logging.getLogger("radix_global.router.request")

SETTLE_S = 5.0  # how long a finished answer waits for its prefill half's numbers


class PrefillHalf:
    """The prefill half sent for ``rid`` (engine rid ``<rid>-prefill``) beside ``decode``."""

    def __init__(self, state: RouterState, model: str, prefill: WorkerEntry,
                 decode: WorkerEntry, rid: str) -> None:
        self.state, self.prefill, self.decode, self.rid = state, prefill, decode, rid
        self.tokens: tuple[int | None, int | None] = (None, None)  # (cached, prompt)
        self._task: asyncio.Future[UpstreamResponse] | None = None
        self._aborts: set[asyncio.Future[Any]] = set()
        util, now = state.pd_util, state.clock()
        util.known_workers((e.worker_id, e.info.role) for e in state.registry.for_model(model)
                           if e.info.role in (Role.PREFILL, Role.DECODE))
        util.begin(prefill.worker_id, Role.PREFILL, now)
        util.begin(decode.worker_id, Role.DECODE, now)
        self._open: list[WorkerId] = [prefill.worker_id, decode.worker_id]

    @property
    def prefill_rid(self) -> str:
        return self.rid + PREFILL_RID_SUFFIX

    def send(self, url: str, body: bytes, headers: dict[str, str]) -> None:
        self._task = asyncio.ensure_future(self.state.proxy.post(url, body, headers))
        self._task.add_done_callback(self._done)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def idle(self, worker: WorkerId | None = None) -> None:
        """``worker`` (default: both still open) done with this request."""
        now = self.state.clock()
        for wid in [w for w in self._open if worker is None or w == worker]:
            self.state.pd_util.end(wid, now)
            self._open.remove(wid)

    async def settled(self) -> None:
        """Give the prefill half (it answers once its KV has left) a moment to answer, so the
        request's record has its numbers; never a long wait."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._task), SETTLE_S)

    def _done(self, task: asyncio.Future[UpstreamResponse]) -> None:
        self.idle(self.prefill.worker_id)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and task.result().status_code < 400:
            with contextlib.suppress(msgspec.DecodeError, RecursionError):
                self.tokens = engine_cached_tokens(msgspec.json.decode(task.result().content))
            return
        log.warning("prefill of %s failed (%r): aborting its decode", self.rid, exc)
        abort = asyncio.ensure_future(self.state.proxy.abort(self.decode.info.url, self.rid))
        self._aborts.add(abort)
        abort.add_done_callback(self._aborts.discard)
