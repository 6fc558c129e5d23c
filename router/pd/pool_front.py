"""What the router holds for the pool PD hand-off (``--pd-mode pool``, ``docs/pd.md``).

:class:`PdFront` owns the :class:`PdOrchestrator`, learns each decode worker's KV capacity once
(``/server_info`` ``max_total_num_tokens``, so that the decode selection can refuse what does not
fit) and tells the orchestrator when a request's prompt is in its prefill worker's pool (read from
the global index, which follows each pool's store events). ``RouterState`` builds one when the
router runs in pool mode; the request side is ``router/request/pool_relay.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from radix_global.types import PoolId, Role, WorkerId
from router.cluster.registry import WorkerEntry
from router.pd.orchestrator import DataPlane, IndexPoolProbe, PdOrchestrator
from router.pd.protocol import PdConfig
from router.routing.contract import IndexView, RouteRequest
from router.routing.decode_select import DecodeSelector

log = logging.getLogger("radix_global.router.pd")

CAPACITY_RETRY_S = 30.0  # a decode worker whose capacity could not be read is asked again after


class RequestPoolProbe:
    """Pages of a request's prompt in the pool of the prefill worker that computed it."""

    def __init__(self, view: Callable[[], IndexView], clock: Callable[[], float]) -> None:
        self._view, self._clock = view, clock
        self.pool_of: dict[str, PoolId] = {}  # request id -> pool of its prefill worker

    async def pages_present(self, req: RouteRequest) -> int:
        pool = self.pool_of.get(req.request_id)
        if pool is None:
            return len(req.page_keys)  # no pool to wait for
        return await IndexPoolProbe(self._view(), pool, self._clock).pages_present(req)


class PdFront:
    """The router's pool-mode PD state: orchestrator, pool probe, learned decode capacities."""

    def __init__(self, data: DataPlane, client: httpx.AsyncClient, config: PdConfig,
                 selector: DecodeSelector, view: Callable[[], IndexView],
                 tbt_slo_s: float | None, clock: Callable[[], float],
                 on_refused: Callable[[WorkerId, BaseException], object],
                 on_answered: Callable[[WorkerId], object]) -> None:
        self.client, self.clock = client, clock  # the control plane: /server_info
        self.probe = RequestPoolProbe(view, clock)
        self.orch = PdOrchestrator(data, config, selector=selector, probe=self.probe,
                                   tbt_slo_s=tbt_slo_s, clock=clock, on_refused=on_refused,
                                   on_answered=on_answered)
        self._asked: dict[WorkerId, float] = {}  # worker -> when its capacity was last asked

    async def learn_capacity(self, entries: Iterable[WorkerEntry]) -> None:
        """Read each decode worker's KV capacity once (retried after a failure, at most every
        ``CAPACITY_RETRY_S``)."""
        capacity, now = self.orch.selector.capacity, self.clock()
        for e in entries:
            wid = e.worker_id
            recently = now - self._asked.get(wid, -1e9) < CAPACITY_RETRY_S
            if e.info.role != Role.DECODE or wid in capacity or recently:
                continue
            self._asked[wid] = now
            try:
                resp = await self.client.get(e.info.url + "/server_info", timeout=5)
                info = resp.json() if resp.status_code == 200 else {}
                tokens = info.get("max_total_num_tokens") if isinstance(info, dict) else None
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("capacity of decode worker %s unknown: %r", wid, exc)
                continue
            if isinstance(tokens, int) and tokens > 0:
                capacity[wid] = tokens

    def report(self) -> dict[str, Any]:
        util = self.orch.util
        return {**util.report(self.clock()).to_json(util.config.mode),
                "decode_capacity_tokens": dict(self.orch.selector.capacity)}
