"""Tell the router how long the pool's loads took (``docs/interfaces.md``, "Where hosts are",
"Measured loads"): the router knows which holder it planned each page from, the backend how long
the read took, and together they measure the links a fetch crosses.

:meth:`LoadReporter.add` is called from SGLang's prefetch threads and never blocks: loads wait
in a bounded queue (the oldest dropped and counted when it is full) and a thread sends them
every ``interval_s`` to the first of the routers that answers (``POST /admin/pool-loads``, at
most :data:`MAX_LOADS_PER_REPORT` a body). A router that cannot be reached, or refuses, costs
that report only (logged once per kind).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

import httpx

from radix_global.pool_loads import MAX_LOADS_PER_REPORT, PoolLoad, PoolLoadReport, encode_report
from sglang_patch.register import first_answer, router_urls

log = logging.getLogger(__name__)
Send = Callable[[bytes], None]  # one encoded report to the router; raises when it failed


def http_send(router_url: str, token: str | None, timeout_s: float = 2.0,
              transport: httpx.BaseTransport | None = None) -> Send:
    """``POST /admin/pool-loads`` to the first of the routers in ``router_url`` that answers."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    client = httpx.Client(timeout=timeout_s, transport=transport, headers=headers)
    urls = [u + "/admin/pool-loads" for u in router_urls(router_url)]

    def send(body: bytes) -> None:
        first_answer(urls, lambda url: client.post(url, content=body)).raise_for_status()

    return send


class LoadReporter:
    def __init__(self, pool_id: str, send: Send, interval_s: float = 2.0,
                 max_waiting: int = 1024) -> None:
        if interval_s <= 0 or max_waiting < 1:
            raise ValueError("interval_s must be > 0 and max_waiting >= 1")
        self.pool_id = pool_id
        self._send = send
        self.interval_s = interval_s
        self._waiting: collections.deque[PoolLoad] = collections.deque(maxlen=max_waiting)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.dropped = 0  # loads pushed out of a full queue
        self.failed = 0  # reports the router did not take
        self._thread = threading.Thread(target=self._loop, name="radix-global-pool-loads",
                                        daemon=True)
        self._thread.start()

    def add(self, first: int, pages: int, nbytes: int, seconds: float) -> None:
        """A load of ``pages`` pages (``nbytes``) starting at page key ``first`` took
        ``seconds``. Nothing that could not be a load is kept."""
        if pages < 1 or nbytes < 1 or not seconds > 0:
            return
        with self._lock:
            if len(self._waiting) == self._waiting.maxlen:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("pool load reports: %d dropped (the router is not taking them "
                                "fast enough)", self.dropped)
            self._waiting.append(PoolLoad(first, pages, nbytes, seconds))

    def flush(self) -> int:
        """Send what waits now; the number of loads the router took."""
        sent = 0
        while True:
            with self._lock:
                batch = [self._waiting.popleft()
                         for _ in range(min(len(self._waiting), MAX_LOADS_PER_REPORT))]
            if not batch:
                return sent
            try:
                self._send(encode_report(PoolLoadReport(self.pool_id, batch)))
                sent += len(batch)
            except (httpx.HTTPError, OSError) as exc:
                self.failed += 1
                if self.failed == 1 or self.failed % 100 == 0:
                    log.warning("pool load report not taken (%d so far): %r", self.failed, exc)
                return sent

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()
