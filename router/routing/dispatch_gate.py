"""Router-side dispatch: hold requests while every engine that could take them is busy with
prefills, and send the held ones in the order of a strategy (``docs/interfaces.md``,
"Router-side dispatch: holding requests while the engines are busy").

Why: an SGLang engine puts every prompt waiting in its queue into one prefill batch, and on a
compute-bound engine the batch's first tokens all come out when the whole batch is done, so a
short prompt sent beside long ones waits for all of them. Sent ``depth`` at a time per compute
server, each prompt's first token comes when its own prefill is done; sending the least work
first (shortest job first) lowers the mean wait further; and a held request is placed when it is
sent, against the cache of that moment.

The gate counts, per compute server (a slot or a shared compute domain: whatever the caller
names), the requests it released that were placed there and have not returned a first token. A
held request is released only to room on the server its policy would place it on (as last
priced): released because one engine has room, it must not be stacked on another that has none.
Pure: the caller passes time and the servers each group (a model) can use.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, NamedTuple

from radix_global.options import opt


class Held(NamedTuple):
    request_id: str
    group: str  # the model: only its servers can make room for it
    arrived: float
    cost_s: float  # predicted work (prefill + fetch), without queueing
    seq: int  # arrival order among equal times
    server: Hashable | None = None  # where its policy would place it (None: anywhere)


class DispatchOrder(ABC):
    """Which held request goes next when a server has room.

    Every order ages: a request held ``overdue_s`` or longer goes before every request held
    less, oldest first. That is the bound against starvation (``docs/interfaces.md``,
    "Router-side dispatch: holding requests while the engines are busy"): a strategy that favours
    short work would otherwise keep a long prompt held for as long as short ones keep arriving."""

    name: ClassVar[str]

    def __init__(self, overdue_s: float = math.inf) -> None:
        self.overdue_s = overdue_s

    def overdue(self, h: Held, now: float) -> bool:
        return now - h.arrived >= self.overdue_s

    def key(self, h: Held, now: float) -> tuple[float, ...]:
        """Sorts ``h`` among the held: the smallest goes first."""
        if self.overdue(h, now):
            return (0.0, h.arrived, h.seq)
        return (1.0, *self._rank(h, now))

    def next(self, held: Sequence[Held], now: float) -> Held:
        """One of ``held`` (never empty)."""
        return min(held, key=lambda h: self.key(h, now))

    def ahead(self, held: Sequence[Held], cost_s: float, now: float) -> list[Held]:
        """Those of ``held`` that would go before a request of ``cost_s`` arriving now (as
        things stand: later arrivals and ageing may change it)."""
        return [h for h in held if self.overdue(h, now) or self._before(h, cost_s, now)]

    @abstractmethod
    def _rank(self, h: Held, now: float) -> tuple[float, ...]:
        """The order among requests that are not overdue: the smallest goes first."""

    @abstractmethod
    def _before(self, h: Held, cost_s: float, now: float) -> bool:
        """Whether ``h`` (not overdue) goes before a request of ``cost_s`` arriving now."""


class Fifo(DispatchOrder):
    name = "fifo"

    def _rank(self, h: Held, now: float) -> tuple[float, ...]:
        return (h.seq,)

    def _before(self, h: Held, cost_s: float, now: float) -> bool:
        return True


class ShortestFirst(DispatchOrder):
    """The least predicted work first; a request held ``max_hold_s`` or longer goes before all
    others (oldest first), so a long prompt waits at most about that long behind short ones."""

    name = "shortest_first"

    def __init__(self, max_hold_s: float) -> None:
        super().__init__(max_hold_s)

    def _rank(self, h: Held, now: float) -> tuple[float, ...]:
        return (h.cost_s, h.seq)

    def _before(self, h: Held, cost_s: float, now: float) -> bool:
        return h.cost_s <= cost_s


class HighestRatio(DispatchOrder):
    """Highest response ratio next: the largest ``(held + work) / work`` first. Short work goes
    first, and a long prompt rises in proportion to its size as it waits: a cliff
    (``ShortestFirst``'s ``max_hold_s``) sends every long prompt of a burst out at once when it
    is reached, onto every engine (``docs/benchmarks-archive.md``, session 19). The ratio alone
    does not bound the wait: a short prompt held a little has a high ratio too, so a steady
    stream of them can hold a long prompt until its timeout; ``overdue_s`` (the router's: half
    the hold timeout) is the bound."""

    name = "highest_ratio"
    MIN_WORK_S = 0.01  # a fully cached request still costs a step

    def _ratio(self, h: Held, now: float) -> float:
        work = max(h.cost_s, self.MIN_WORK_S)
        return (now - h.arrived + work) / work

    def _rank(self, h: Held, now: float) -> tuple[float, ...]:
        return (-self._ratio(h, now), h.seq)

    def _before(self, h: Held, cost_s: float, now: float) -> bool:
        # A held request of no more work stays ahead of it; one of more work ``c`` held ``w`` is
        # overtaken once it has waited ``w x cost / (c - cost)``: counted ahead when that is at
        # least its own work, i.e. ``w >= c - cost`` (an estimate: the backlog drains meanwhile).
        return h.cost_s <= cost_s or now - h.arrived >= h.cost_s - cost_s


def fair_share(depth: int, me: str, waiting: Collection[str], key: int, turn: int) -> int:
    """This router's share of a server's ``depth`` while the routers in ``waiting`` (its peers)
    hold requests for that server too: ``depth`` split evenly among them and ``me``, the
    remainder going to the routers whose rank, rotated by the server's ``key`` and by ``turn``
    (a clock tick all routers agree on), comes first. Every router computes the same split from
    the same view, so together they book at most ``depth`` where each would book all of it;
    rotating the remainder keeps a router from waiting for ever where there are more routers
    than places."""
    if not waiting:
        return depth
    routers = sorted({me, *waiting})
    base, extra = divmod(depth, len(routers))
    return base + ((routers.index(me) + key + turn) % len(routers) < extra)


OFF = "off"
# name -> the order, given (max_hold_s, overdue_s)
DISPATCH_ORDERS: dict[str, Callable[[float, float], DispatchOrder]] = {
    Fifo.name: lambda max_hold_s, overdue_s: Fifo(overdue_s),
    ShortestFirst.name: lambda max_hold_s, overdue_s: ShortestFirst(min(max_hold_s, overdue_s)),
    HighestRatio.name: lambda max_hold_s, overdue_s: HighestRatio(overdue_s),
}


@dataclass(frozen=True)
class DispatchConfig:
    """Router-side dispatch: holding requests while the engines are busy (docs/interfaces.md).

    Hold streaming requests while every engine that could take them has ``depth`` prefills in
    flight (``RouterConfig.dispatch``, options ``dispatch_*``; the defaults here are the
    router's)."""

    # Measured on the cache-pressure demo (docs/benchmarks-archive.md, session 19): highest_ratio
    # had 0.84x the mean and 0.64x the p90 TTFT of no gate, shortest_first with its 2 s bound
    # 0.90x / 0.80x (side by side, one run); fifo was worse than no gate.
    order: Annotated[Literal["off", "fifo", "shortest_first", "highest_ratio"], opt(
        "hold streaming requests while the engines are busy, and send them in this order",
        name="dispatch")] = "highest_ratio"
    depth: Annotated[int, opt(
        "requests per engine without a first token before the router holds more", ge=1)] = 2
    max_hold_s: Annotated[float, opt(
        "shortest_first: a request held this long goes first", gt=0)] = 2.0
    timeout_s: Annotated[float, opt(
        "a request held this long is answered 503, never sent; held half of it, before every "
        "request held less", gt=0)] = 60.0
    # A full held queue answers 503 at once: a bound on the router's memory that does not
    # depend on connections and the hold timeout (bytes: the held requests' bodies).
    max_held: Annotated[int, opt(
        "requests held at most; beyond, 503 with Retry-After at once", ge=1)] = 4096
    # as sent; decoded, a body takes a few times that
    max_held_bytes: Annotated[int, opt(
        "request body bytes held at most; beyond, 503 at once", ge=1)] = 64 * 1024 * 1024

    @property
    def overdue_s(self) -> float:
        """Held this long, a request goes before every request held less (oldest first), so
        that it is sent within its timeout while the engines make room."""
        return self.timeout_s / 2

    def __post_init__(self) -> None:
        if self.order != OFF and self.order not in DISPATCH_ORDERS:
            raise ValueError(f"dispatch must be one of {[OFF, *DISPATCH_ORDERS]}, "
                             f"got {self.order!r}")
        if self.depth < 1:
            raise ValueError(f"dispatch_depth must be >= 1, got {self.depth}")
        if not self.max_hold_s > 0 or not self.timeout_s > 0:
            raise ValueError(f"dispatch_max_hold_s and dispatch_timeout_s must be > 0, got "
                             f"{self.max_hold_s} and {self.timeout_s}")
        if self.max_held < 1 or self.max_held_bytes < 1:
            raise ValueError(f"dispatch_max_held and dispatch_max_held_bytes must be >= 1, got "
                             f"{self.max_held} and {self.max_held_bytes}")

    def gate(self) -> DispatchGate | None:
        """The gate this config asks for; None when dispatch is off."""
        if self.order == OFF:
            return None
        return DispatchGate(DISPATCH_ORDERS[self.order](self.max_hold_s, self.overdue_s),
                            self.depth)


class DispatchGate:
    # Placed requests that ended before their first token, remembered so that a retry on another
    # worker (the relay's, after a refused connection) counts there; ids are unique, so the rest
    # are never placed again and age out.
    RETRY_MEMORY = 4096

    def __init__(self, order: DispatchOrder, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.order, self.depth = order, depth
        self._held: dict[str, Held] = {}
        # released, not yet routed -> its group and the server it was released to
        self._unplaced: dict[str, tuple[str, Hashable]] = {}
        self._server_of: dict[str, Hashable] = {}
        self._in_flight: Counter[Hashable] = Counter()
        self._may_retry: OrderedDict[str, None] = OrderedDict()
        self._seq = 0
        # other routers' prefills without a first token on a server (the shared load view);
        # they take room there as this gate's own do
        self.elsewhere: Callable[[Hashable], int] | None = None
        # how much of a server's depth this gate may book while other routers hold requests for
        # it too, given whether this gate holds any for it (:func:`fair_share`; None: all of it)
        self.share: Callable[[Hashable, bool], int] | None = None

    def hold(self, request_id: str, group: str, cost_s: float, now: float,
             server: Hashable | None = None) -> None:
        """Hold ``request_id`` (its policy would place it on ``server``) until :meth:`release`
        returns it. A duplicate id is an error."""
        if request_id in self._held or request_id in self._unplaced \
                or request_id in self._server_of:
            raise ValueError(f"request {request_id!r} is already at the gate")
        self._seq += 1
        self._held[request_id] = Held(request_id, group, now, max(0.0, cost_s), self._seq,
                                      server)

    def release(self, servers: Mapping[str, Collection[Hashable]], now: float) -> list[str]:
        """The held requests to send now, in the strategy's order, each to room on its server
        (``depth`` minus the gated requests there without a first token, minus those released
        to it and not yet placed; a request whose server is not among its group's ``servers``
        takes the one with the most room). One whose server has no room stays held, and the
        next in order may go. A group with no server releases all (routing answers them: no
        worker). Released ids count as unplaced until :meth:`placed` or :meth:`drop`."""
        out: list[str] = []
        for group in self.groups():
            pool = set(servers.get(group, ()))
            free = self._free(group, pool)
            room = sum(max(0, n) for n in free.values())
            if pool and room <= 0:
                continue
            # sorted once: picking the next by scanning the rest each time made a pump
            # quadratic in the held requests
            candidates = sorted((h for h in self._held.values() if h.group == group),
                                key=lambda h: self.order.key(h, now))
            for pick in candidates:
                if pool and room <= 0:
                    break
                target: Hashable = None
                if pool:
                    target = pick.server if pick.server in free else max(free, key=free.__getitem__)
                    if free[target] <= 0:
                        continue  # its engine is busy: it waits for it, or to be priced elsewhere
                    free[target] -= 1
                    room -= 1
                del self._held[pick.request_id]
                self._unplaced[pick.request_id] = (group, target)
                out.append(pick.request_id)
        return out

    def _free(self, group: str, servers: set[Hashable]) -> dict[Hashable, int]:
        elsewhere, share = self.elsewhere, self.share
        waiting = {h.server for h in self._held.values() if h.group == group} if share else ()
        # room left on the server, and of this gate's share of it when peers wait for it too
        free = {s: min(self.depth - (elsewhere(s) if elsewhere else 0),
                       share(s, s in waiting) if share else self.depth) - self._in_flight[s]
                for s in servers}
        for g, s in self._unplaced.values():
            if g == group and s in free:
                free[s] -= 1
        return free

    def has_room(self, group: str, servers: Collection[Hashable]) -> bool:
        """Whether :meth:`release` could send one of ``group``'s held requests now."""
        pool = set(servers)
        return not pool or max(self._free(group, pool).values()) > 0

    def groups(self) -> set[str]:
        """The groups with held requests."""
        return {h.group for h in self._held.values()}

    def held_ids(self, group: str | None = None) -> list[str]:
        """The held requests of ``group`` (None: of every group)."""
        return [h.request_id for h in self._held.values() if group is None or h.group == group]

    def group_of(self, request_id: str) -> str | None:
        """The group of a held request; None once it is not held."""
        held = self._held.get(request_id)
        return held.group if held is not None else None

    def reprice(self, request_id: str, cost_s: float, server: Hashable | None = None) -> None:
        """A held request's predicted work or server changed (its prefix got cached meanwhile:
        a conversation's previous turn finished; the queues moved). Ignored once it is not
        held."""
        held = self._held.get(request_id)
        if held is not None:
            self._held[request_id] = held._replace(cost_s=max(0.0, cost_s), server=server)

    def wait_s(self, group: str, cost_s: float, servers: int, now: float) -> float:
        """The predicted hold of a request of ``group`` and ``cost_s`` arriving now: the work
        held ahead of it, shared by its group's ``servers`` (0: none; nothing is held then)."""
        ahead = self.order.ahead([h for h in self._held.values() if h.group == group], cost_s,
                                 now)
        return sum(h.cost_s for h in ahead) / servers if servers > 0 and ahead else 0.0

    def placed(self, request_id: str, server: Hashable) -> None:
        """A released request was routed to ``server`` (again, when retried after its worker
        refused it); it counts there until its first token. Ids the gate did not release are
        ignored (they were never held)."""
        if self._unplaced.pop(request_id, None) is None:
            if request_id not in self._may_retry:
                return
            del self._may_retry[request_id]
        self._server_of[request_id] = server
        self._in_flight[server] += 1

    def first_token(self, request_id: str) -> bool:
        """``request_id``'s first token came back. True when that made room."""
        server = self._server_of.pop(request_id, None)
        if server is None:
            return False
        self._in_flight[server] -= 1
        if self._in_flight[server] <= 0:
            del self._in_flight[server]
        return True

    def drop(self, request_id: str) -> bool:
        """``request_id`` ended or left, wherever it is at the gate. True when that made room
        (it was released and not yet done with its prefill). Idempotent."""
        self._held.pop(request_id, None)
        if request_id in self._server_of:
            self._may_retry[request_id] = None
            while len(self._may_retry) > self.RETRY_MEMORY:
                self._may_retry.popitem(last=False)
        return self._unplaced.pop(request_id, None) is not None or self.first_token(request_id)

    def held(self) -> int:
        return len(self._held)

    def held_servers(self) -> list[Hashable]:
        """The server each held request's policy placed it on (None: none), one per request."""
        return [h.server for h in self._held.values()]

    def released_to(self, request_id: str) -> Hashable | None:
        """The server ``request_id`` was released to while it is not placed yet (None: not
        released, or released to any server: its group had none)."""
        released = self._unplaced.get(request_id)
        return released[1] if released is not None else None

    def released_servers(self) -> list[Hashable]:
        """The server each released, not yet placed request was released to, one per request
        (the room it takes until :meth:`placed` or :meth:`drop`)."""
        return [server for _, server in self._unplaced.values()]

    def in_flight(self, server: Hashable) -> int:
        return self._in_flight[server]
