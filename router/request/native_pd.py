"""Native PD (SGLang's own disaggregation) in the relay: the prefill half of one routed attempt.

The relay sends the client's request to the prefill and the decode worker at once, with the
bootstrap fields of ``router.pd.protocol.native_body``; the client gets the decode worker's
answer. :class:`PrefillHalf` is the other half: both workers count as busy in the utilisation
report (``RouterState.pd_util``) from the send until their answers, a failed prefill aborts
the decode half (it would wait for KV that never comes), and the prefill's cache numbers go
into the request's record when they arrive (the client's answer never waits for them).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from radix_global.types import Role, WorkerId
from router.cluster.registry import WorkerEntry
from router.keying.prompt import engine_cached_tokens
from router.pd.protocol import PREFILL_RID_SUFFIX
from router.request.inbound import Inbound
from router.state import RouterState
from router.transport.bodies import json_or_none
from router.transport.proxy import UpstreamResponse

log = logging.getLogger("radix_global.router.request")


class PrefillHalf:
    """The prefill half sent for ``rid`` (engine rid ``<rid>-prefill``) beside ``decode``."""

    def __init__(self, state: RouterState, inbound: Inbound, prefill: WorkerEntry,
                 decode: WorkerEntry, rid: str) -> None:
        self.state, self.inbound, self.prefill, self.decode = state, inbound, prefill, decode
        self.rid = rid
        self._tokens: tuple[int | None, int | None] = (None, None)  # (cached, prompt)
        self._record: dict[str, Any] | None = None
        self._aborts: set[asyncio.Future[Any]] = set()
        util, now = state.pd_util, state.clock()
        util.known_workers((e.worker_id, e.info.role)
                           for e in state.registry.for_model(inbound.model)
                           if e.info.role in (Role.PREFILL, Role.DECODE))
        util.begin(prefill.worker_id, Role.PREFILL, now)
        util.begin(decode.worker_id, Role.DECODE, now)
        self._open: list[WorkerId] = [prefill.worker_id, decode.worker_id]
        self._task: asyncio.Future[UpstreamResponse] | None = None

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

    def report_into(self, record: dict[str, Any]) -> None:
        """Put the prefill's cache numbers into the request's record, now or when it answers."""
        self._record = record
        record["prefill_cached_tokens"], record["prefill_prompt_tokens"] = self._tokens

    def _done(self, task: asyncio.Future[UpstreamResponse]) -> None:
        self.idle(self.prefill.worker_id)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and task.result().status_code < 400:
            self._tokens = engine_cached_tokens(json_or_none(task.result().content))
            if self._record is not None:
                self.report_into(self._record)
            return
        log.warning("prefill of %s failed (%r): aborting its decode", self.rid, exc)
        for rid in self.inbound.engine_rids(self.rid):
            abort = asyncio.ensure_future(self.state.proxy.abort(self.decode.info.url, rid))
            self._aborts.add(abort)
            abort.add_done_callback(self._aborts.discard)
