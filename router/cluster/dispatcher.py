"""The async face of the router-side dispatch gate (``router/routing/dispatch_gate.py``,
``docs/interfaces.md``, "Router-side dispatch: holding requests while the engines are busy").

A held request's coroutine waits on a future of its own; :meth:`Dispatcher.pump` asks the gate
what to release and resolves those futures. It is pumped when a request arrives, when the driver
reports room (a first token, a failure), and every ``tick_s`` while anything is held (a worker
that joined or came back makes room without any request ending).

Under abuse (thousands held, all leaving at once) a pump stays cheap: the gate sorts its held
requests once per pump, and a pump prices again at most :attr:`Dispatcher.REPRICE_PER_PUMP` of
them, the longest unpriced first, not every held request at every release. A held request whose
client left is never routed (the hold is awaited under ``asyncio.timeout``: ``asyncio.wait_for``
of Python 3.11 loses a cancel that arrives as the future is resolved). The held queue is bounded
by count and by body bytes (:class:`HeldQueueFull`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Hashable
from typing import NamedTuple

from radix_global.types import Role
from router.cluster.registry import WorkerRegistry
from router.cluster.slots import worker_states
from router.metrics import RouterMetrics
from router.routing.dispatch_gate import DispatchConfig, DispatchGate
from router.routing.driver import PolicyDriver

log = logging.getLogger("radix_global.router.dispatch")


class Priced(NamedTuple):
    """A held request as its policy sees it now."""

    cost_s: float  # predicted work: prefill + fetch seconds, without queueing
    server: Hashable  # the compute server it would be placed on


class HeldTooLong(Exception):
    """A request was held longer than its bound without any engine making room."""


class HeldQueueFull(Exception):
    """The held queue is at its bound (count or bytes): the request is not held (HTTP 503)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Dispatcher:
    # Pricing a held request asks the policy (and its index matches): a pump that priced every
    # held request at every release was quadratic in a long held queue.
    REPRICE_PER_PUMP = 32

    def __init__(self, gate: DispatchGate, driver: PolicyDriver, registry: WorkerRegistry,
                 metrics: RouterMetrics, clock: Callable[[], float], tick_s: float = 0.1,
                 config: DispatchConfig | None = None) -> None:
        self.gate, self._driver, self._registry = gate, driver, registry
        self._metrics, self._clock, self.tick_s = metrics, clock, tick_s
        self.config = config = config or DispatchConfig()
        self.max_held, self.max_held_bytes = config.max_held, config.max_held_bytes
        self._waiters: dict[str, asyncio.Future[None]] = {}
        # the least recently priced first
        self._reprice: collections.OrderedDict[str, Callable[[], Priced | None]] = \
            collections.OrderedDict()
        self._bytes: dict[str, int] = {}
        self.held_bytes = 0
        self._ticker: asyncio.Task[None] | None = None
        driver.on_room = self.pump

    async def wait(self, request_id: str, model: str, priced: Priced, timeout_s: float,
                   reprice: Callable[[], Priced | None] | None = None, size_bytes: int = 0
                   ) -> float:
        """Hold ``request_id`` (``priced``: its predicted work and the server its policy would
        place it on; ``size_bytes``: what holding it keeps in memory) until the gate releases
        it; returns the seconds held (0: released at once). Raises :class:`HeldQueueFull` at
        once when it would stay held past a bound of the held queue (one released at once is
        never refused), :class:`HeldTooLong` after ``timeout_s`` (the
        request leaves the gate). Cancelled (the client left): it leaves the gate, even when
        the cancel comes as it is released. ``reprice``: the same now (None: keep the last),
        asked before a release that has room for its model (at most ``REPRICE_PER_PUMP`` held
        requests per pump, the longest unpriced first)."""
        t0 = self._clock()
        future = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = future
        self._bytes[request_id] = size_bytes
        self.held_bytes += size_bytes
        if reprice is not None:
            self._reprice[request_id] = reprice
        self.gate.hold(request_id, model, priced.cost_s, t0, priced.server)
        self.pump()
        waited = not future.done()  # released by that pump: never held
        if waited and (self._ticker is None or self._ticker.done()):
            self._ticker = asyncio.create_task(self._tick())
        try:
            if waited:  # only a request that stays held counts against the bounds
                self._refuse_if_full(request_id, model, priced, timeout_s)
            async with asyncio.timeout(timeout_s):
                await future
        except TimeoutError:
            self.gate.drop(request_id)
            raise HeldTooLong(f"held at the router for {timeout_s:g} s: no worker made room"
                              ) from None
        except asyncio.CancelledError:
            if self.gate.drop(request_id):  # released as it was cancelled: the room is free
                self.pump()
            raise
        finally:
            self._waiters.pop(request_id, None)
            self._reprice.pop(request_id, None)
            self.held_bytes -= self._bytes.pop(request_id, 0)
            self._metrics.dispatch_held.set(self.gate.held())
        held = self._clock() - t0 if waited else 0.0
        self._metrics.dispatch_hold_s.observe(held)
        return held

    def _refuse_if_full(self, request_id: str, model: str, priced: Priced,
                        timeout_s: float) -> None:
        """:class:`HeldQueueFull` (the request leaves the gate) when holding ``request_id`` puts
        the held queue past a bound; Retry-After: its predicted hold, within [1 s, the hold
        timeout]."""
        full = (f"{self.max_held} requests held" if self.gate.held() > self.max_held else
                f"at most {self.max_held_bytes} bytes held"
                if self.held_bytes > self.max_held_bytes else None)
        if full is None:
            return
        self.gate.drop(request_id)
        retry = min(timeout_s, max(1.0, self.wait_s(model, priced.cost_s)))
        raise HeldQueueFull(f"the router's held queue is full ({full}): no engine has room",
                            retry)

    def wait_s(self, model: str, cost_s: float) -> float:
        """The predicted hold of a request of ``model`` and ``cost_s`` arriving now."""
        servers = self._servers().get(model, set())
        return self.gate.wait_s(model, cost_s, len(servers), self._clock())

    def pump(self) -> None:
        """Release what the gate lets go now. Where a model's servers have room, held requests
        are priced again first (at most ``REPRICE_PER_PUMP``, those priced longest ago): the
        order is by the work each needs now."""
        if not self.gate.held():  # every first token and end pumps: most find nothing held
            return
        # Those whose client left since the last pump leave the gate first: released one by one
        # (each release sorting the rest), a thousand clients gone at once stalled the loop.
        for request_id in self.gate.held_ids():
            future = self._waiters.get(request_id)
            if future is None or future.done():
                self.gate.drop(request_id)
        servers = self._servers()
        roomy = {group for group in self.gate.groups()
                 if self.gate.has_room(group, servers.get(group, ()))}
        if roomy:
            self._reprice_stalest(roomy)
        released = self.gate.release(servers, self._clock())
        while released:
            gone = False
            for request_id in released:
                future = self._waiters.get(request_id)
                if future is not None and not future.done():
                    future.set_result(None)
                else:  # its coroutine is gone (it timed out or was cancelled meanwhile)
                    gone = self.gate.drop(request_id) or gone
            # the room a gone one took is free again: the next in order may have it now
            released = self.gate.release(servers, self._clock()) if gone else []
        self._metrics.dispatch_held.set(self.gate.held())

    def _reprice_stalest(self, groups: set[str]) -> None:
        """Price again the held requests of ``groups`` priced longest ago, at most
        ``REPRICE_PER_PUMP``."""
        done: list[str] = []
        for request_id, reprice in self._reprice.items():
            if len(done) >= self.REPRICE_PER_PUMP:
                break
            if self.gate.group_of(request_id) not in groups:
                continue
            done.append(request_id)
            try:
                priced = reprice()
            except Exception:  # one request's policy error must not stall the others
                log.exception("pricing held request %s failed: its last price stays",
                              request_id)
                continue
            if priced is not None:
                self.gate.reprice(request_id, priced.cost_s, priced.server)
        for request_id in done:
            self._reprice.move_to_end(request_id)

    def _servers(self) -> dict[str, set[Hashable]]:
        """Per model, the compute servers of its accepting slots that can run a prefill."""
        queue = self._driver.cost.queue
        return {model: {queue.server(w.slot) for w in worker_states(self._registry.for_model(model))
                        if w.accepting and w.role != Role.DECODE}
                for model in self._registry.models()}

    async def _tick(self) -> None:
        while self.gate.held():
            await asyncio.sleep(self.tick_s)
            try:
                self.pump()
            except Exception:  # the ticker must outlive one bad round
                log.exception("dispatch pump failed")
