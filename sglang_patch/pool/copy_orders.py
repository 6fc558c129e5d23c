"""Copy orders from the router: this worker's pool backend asks for them and carries them out
(``docs/interfaces.md``, "Where hosts are", "Copies across fault domains").

A thread asks ``GET /admin/pool-copies?pool_id=P`` every ``interval_s`` at every router the
worker registered with (when several share a view, only the leader plans copies, and it need
not be the first), and hands each order of this backend's namespace to ``handle`` (which copies
the pages into this worker's own segment and publishes them). A router that cannot be reached,
or refuses, costs that round its orders only (logged once per kind); an order that is not an
object with a namespace and a list of 64-hex-digit keys is dropped and logged; an order whose
handling fails is logged and the next one goes on. Nothing raises into SGLang.

The same answer names the hosts whose segment died with its worker (``lost_hosts``; "Reads
around a lost host"): handed to ``on_lost`` each round, so the pool stops reading the replicas
the store still lists there. A poller without ``handle`` (a tensor-parallel rank that copies
nothing) only listens for those.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx

from sglang_patch.register import router_urls

log = logging.getLogger(__name__)
MAX_LOST_HOSTS = 1024


class Answer(NamedTuple):
    """One round's answer of the routers: the orders, and the hosts they know lost."""

    orders: list[Any]
    lost_hosts: list[str]


Fetch = Callable[[], Answer]  # one round's answer from the routers; raises when it failed
_KEY = re.compile(r"[0-9a-f]{64}")
MAX_KEYS_PER_ORDER = 65_536


def http_fetch(router_url: str, pool_id: str, token: str | None, timeout_s: float = 2.0,
               transport: httpx.BaseTransport | None = None, orders: bool = True) -> Fetch:
    """``GET /admin/pool-copies`` at every router in ``router_url``: their orders together (a
    404, the worker not registered there, answers none); raises only when none answered.
    ``orders`` False: the lost hosts only, the orders left for the rank that copies."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    client = httpx.Client(timeout=timeout_s, transport=transport, headers=headers)
    urls = [u + "/admin/pool-copies" for u in router_urls(router_url)]
    params = {"pool_id": pool_id, "orders": "1" if orders else "0"}

    def fetch() -> Answer:
        orders: list[Any] = []
        lost: set[str] = set()
        failure: Exception | None = None
        answered = 0
        for url in urls:
            try:
                resp = client.get(url, params=params)
                if resp.status_code == 404:  # not registered there yet (or again): no orders
                    answered += 1
                    continue
                resp.raise_for_status()
                body = resp.json()
                got = body.get("orders") if isinstance(body, dict) else None
                orders += got if isinstance(got, list) else []
                hosts = body.get("lost_hosts") if isinstance(body, dict) else None
                if isinstance(hosts, list) and len(hosts) <= MAX_LOST_HOSTS:
                    lost.update(h for h in hosts if isinstance(h, str) and 0 < len(h) <= 255)
                answered += 1
            except (httpx.HTTPError, ValueError) as exc:
                failure = exc
        if failure is not None and not answered:
            raise failure
        return Answer(orders, sorted(lost))

    return fetch


def valid_keys(order: Any, namespace: str) -> list[str] | None:
    """The storage keys of an order for ``namespace``; None for another namespace's or a
    malformed one."""
    if not isinstance(order, dict) or order.get("namespace") != namespace:
        return None
    keys = order.get("keys")
    if (not isinstance(keys, list) or not 0 < len(keys) <= MAX_KEYS_PER_ORDER
            or not all(isinstance(k, str) and _KEY.fullmatch(k) for k in keys)):
        return None
    return keys


class CopyOrders:
    def __init__(self, namespace: str, fetch: Fetch, handle: Callable[[list[str]], int] | None,
                 interval_s: float = 2.0,
                 on_lost: Callable[[list[str]], None] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.namespace, self._fetch, self._handle = namespace, fetch, handle
        self._on_lost = on_lost
        self.interval_s = interval_s
        self.failed = self.malformed = self.copied = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="radix-global-copy-orders",
                                        daemon=True)
        self._thread.start()

    def poll(self) -> int:
        """One round: the pages copied."""
        try:
            answer = self._fetch()
        except Exception as exc:  # whatever the router or the network did: this round only
            self.failed += 1
            if self.failed == 1 or self.failed % 100 == 0:
                log.warning("copy orders not fetched (%d so far): %r", self.failed, exc)
            return 0
        if self._on_lost is not None:
            try:
                self._on_lost(answer.lost_hosts)
            except Exception:  # a bug there must not stop the orders
                log.exception("lost hosts not applied")
        copied, handle = 0, self._handle
        if handle is None:  # a listener only
            return 0
        for order in answer.orders:
            keys = valid_keys(order, self.namespace)
            if keys is None:
                if not (isinstance(order, dict) and order.get("namespace") != self.namespace):
                    self.malformed += 1
                    log.warning("copy order dropped: not {namespace, keys: [64 hex digits]}")
                continue
            try:
                copied += handle(keys)
            except Exception:  # the store or a bug: this order only
                self.failed += 1
                log.exception("copy order of %d pages failed", len(keys))
        self.copied += copied
        return copied

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 15)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()
