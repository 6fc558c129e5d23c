"""Liveness of workers: discovery and HTTP health checks of command-line workers, heartbeat
expiry of registered ones. The only async part of the worker registry.

A command-line worker (``--workers URL[#overrides]``) is asked ``/health``, then ``/server_info``
(SGLang) or else ``/v1/models`` (an OpenAI server such as vLLM); what the answer means is
``router/cluster/discovery.py`` (pure). It joins the registry once it answers, leaves after
``health_failures_to_remove`` failed checks (its index entries are dropped) and joins again when
it answers again.

On the request path a worker that cannot be connected to is judged by :meth:`HealthMonitor.
connect_failed` (``router/cluster/registry.py`` ``ConnectFailures``): a connect timeout is retried
elsewhere and evicts only after ``connect_timeouts_to_remove`` consecutive failures; a refused
connection evicts after ``connect_refusals_to_remove`` (default 1). Counted in
``radix_global_connect_failures_total{worker,kind}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import httpx
from prometheus_client import CollectorRegistry, Counter

from radix_global.options import opt
from radix_global.registration import RegistrationError
from router.cluster.discovery import (
    ModelOverrides,
    cli_worker_id,
    info_from_server_info,
    server_info_from_models,
    split_worker_spec,
)
from router.cluster.registry import (
    CONNECT_REFUSED,
    CONNECT_TIMEOUT,
    ConnectFailures,
    RegistryError,
    Source,
    WorkerEntry,
    WorkerRegistry,
)
from router.keying.lora import adapters_from_server_info

log = logging.getLogger("radix_global.router.cluster.health")


def connect_failure_kind(exc: BaseException) -> str:
    """``connect_timeout`` when the failure (or what it wraps, ``raise ... from``) is a timeout
    (``TimeoutError``, httpx's timeouts, an OS-level ``ETIMEDOUT``), else ``connect_refused``
    (refused, reset, unreachable: nothing takes connections there)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a bounded walk down the cause chain
        if seen is None:
            break
        if isinstance(seen, TimeoutError | httpx.TimeoutException) or (
                isinstance(seen, OSError) and seen.errno == errno.ETIMEDOUT):
            return CONNECT_TIMEOUT
        seen = seen.__cause__
    return CONNECT_REFUSED


@dataclass(frozen=True)
class HealthConfig:
    """Workers and their liveness (router/cluster/health.py).

    Which workers to discover and when to give up on one: registered workers heartbeat,
    command-line workers are health-checked (``RouterConfig.health``)."""

    workers: Annotated[tuple[str, ...], opt(
        "worker base URLs (URL[#field=value&...]), health-checked over HTTP",
        aliases=("--worker-urls",), metavar="URL")] = ()
    heartbeat_timeout_s: Annotated[float, opt(
        "a registered worker silent this long is removed", gt=0)] = 20.0
    health_check_interval_s: Annotated[float, opt(
        "seconds between health checks of command-line workers", gt=0)] = 2.0
    # SGLang's /health waits for a 1-token generation
    health_check_timeout_s: Annotated[float, opt("a health check's timeout", gt=0)] = 30.0
    health_failures_to_remove: Annotated[int, opt(
        "failed checks in a row that remove a worker", ge=1)] = 3
    connect_timeouts_to_remove: Annotated[int, opt(
        "connect timeouts in a row (on the request path) that remove a worker", ge=1)] = 3
    connect_refusals_to_remove: Annotated[int, opt(
        "refused connections in a row that remove a worker", ge=1)] = 1


class HealthMonitor:
    """Runs the periodic checks. ``on_change`` is called after any membership change."""

    def __init__(self, registry: WorkerRegistry, config: HealthConfig, client: httpx.AsyncClient,
                 clock: Callable[[], float] = time.monotonic,
                 models: ModelOverrides | None = None,
                 on_change: Callable[[], None] | None = None,
                 on_alive: Callable[[str], None] | None = None,
                 busy: Callable[[str], bool] | None = None,
                 on_dead: Callable[[WorkerEntry], None] | None = None,
                 may_expire: Callable[[], bool] | None = None) -> None:
        self.registry = registry
        self.config = config
        self.models = models or ModelOverrides()  # what command-line workers' models are
        self.client = client
        self.clock = clock
        self.on_change = on_change
        self.on_alive = on_alive  # a passed check (forwarded as a heartbeat to the index)
        self.busy = busy  # worker id -> has requests of ours in flight
        # a worker removed as dead (silent, failed checks, refused): end what it still carries
        self.on_dead = on_dead
        # False while heartbeats may be going to another router that cannot tell this one
        # (the shared view's service is down): silence is no evidence then
        self.may_expire = may_expire
        self._failures: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self.connect_failures = ConnectFailures(config.connect_timeouts_to_remove,
                                                config.connect_refusals_to_remove)
        self._connect_metric: Counter | None = None
        for spec in config.workers:  # a bad --workers fragment fails at start, not every round
            split_worker_spec(spec)

    async def discover(self, spec: str) -> bool:
        """Ask a command-line worker (``URL[#overrides]``) who it is and add it; False if it
        does not answer yet."""
        url, overrides = split_worker_spec(spec)
        timeout = self.config.health_check_timeout_s
        try:
            health = await self.client.get(f"{url}/health", timeout=timeout)
            if health.status_code != 200:
                return False
            resp = await self.client.get(f"{url}/server_info", timeout=timeout)
            server = resp.json() if resp.status_code == 200 else None
            if not isinstance(server, dict):  # not SGLang: an OpenAI server's model list
                resp = await self.client.get(f"{url}/v1/models", timeout=timeout)
                server = server_info_from_models(resp.json()) if resp.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return False
        try:
            info, model_path, context = info_from_server_info(url, server, self.models,
                                                              overrides)
            self.registry.add(info, Source.CLI, self.clock(), model_path=model_path,
                              context_length=context, lora=adapters_from_server_info(server))
        except (RegistrationError, RegistryError) as exc:
            log.error("worker %s refused: %s", url, exc)
            return False
        log.info("worker %s joined as %s (%s, page size %d)", url, info.worker_id,
                 info.namespace, info.page_size)
        return True

    async def check_once(self) -> None:
        now = self.clock()
        expired = (self.registry.expire(now, self.config.heartbeat_timeout_s)
                   if self.may_expire is None or self.may_expire() else [])
        for entry in expired:
            log.warning("worker %s sent no heartbeat for %.0f s: removed", entry.worker_id,
                        self.config.heartbeat_timeout_s)
            self._dead(entry)
        changed = bool(expired)
        known = {e.info.url for e in self.registry.all() if e.source is Source.CLI}
        specs = {split_worker_spec(s)[0]: s for s in self.config.workers}
        urls = list(specs)
        # Checked concurrently: SGLang's /health runs a 1-token generation and answers only
        # once the scheduler replies, which takes seconds on a busy worker.
        results = await asyncio.gather(*(
            self._healthy(u) if u in known else self.discover(specs[u]) for u in urls))
        for url, result in zip(urls, results, strict=True):
            if url not in known:
                changed |= result is True
                continue
            wid = cli_worker_id(url)
            if result is True or (result is None and self.busy is not None and self.busy(wid)):
                # alive, or too busy with our own requests to answer in time: not a failure
                self._failures[wid] = 0
                if self.on_alive is not None:
                    self.on_alive(wid)
                continue
            self._failures[wid] = self._failures.get(wid, 0) + 1
            if self._failures[wid] >= self.config.health_failures_to_remove:
                log.warning("worker %s failed %d health checks: removed", url, self._failures[wid])
                self.mark_dead(wid)
                changed = True
        if changed and self.on_change is not None:
            self.on_change()

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        self._connect_metric = Counter(
            "radix_global_connect_failures", "Failed connects to a worker on the request path "
            "(connect_timeout: retried elsewhere, evicted after repeats; connect_refused)",
            ["worker", "kind"], registry=registry)

    def connect_failed(self, worker_id: str, exc: BaseException) -> bool:
        """A request could not be delivered to ``worker_id`` (the caller retries elsewhere);
        counted, and the worker removed when the failure streak says so. True if removed."""
        kind = connect_failure_kind(exc)
        if self._connect_metric is not None:
            self._connect_metric.labels(worker_id, kind).inc()
        streak = self.connect_failures.streak(worker_id) + 1
        evict = self.connect_failures.failed(worker_id, kind)
        log.warning("connect to worker %s failed (%s, %d in a row): %s", worker_id, kind, streak,
                    "removed" if evict else "kept")
        if evict:
            # Refused: the process is gone. Timeouts: maybe a full accept queue of a busy
            # engine, whose established streams are fine: those are left to finish.
            self.mark_dead(worker_id, gone=kind == CONNECT_REFUSED)
            if self.on_change is not None:
                self.on_change()
        return evict

    def connect_ok(self, worker_id: str) -> None:
        """A request reached ``worker_id``: its connect-failure streak ends."""
        self.connect_failures.succeeded(worker_id)

    def mark_dead(self, worker_id: str, gone: bool = True) -> None:
        """Remove a worker now (failed checks, or failed connects on the request path); ``gone``:
        it is known dead, and what it still carries is ended (``on_dead``)."""
        if self.registry.find(worker_id) is not None:
            entry = self.registry.remove(worker_id)
            if gone:
                self._dead(entry)
        self._failures[worker_id] = 0
        self.connect_failures.forget(worker_id)

    def _dead(self, entry: WorkerEntry) -> None:
        if self.on_dead is not None:
            self.on_dead(entry)

    async def _healthy(self, url: str) -> bool | None:
        """True: healthy; False: refused or an error status; None: no answer in time."""
        try:
            resp = await self.client.get(f"{url}/health",
                                         timeout=self.config.health_check_timeout_s)
        except httpx.TimeoutException:
            return None
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def _loop(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # a bug in one round must not stop liveness checking
                log.exception("health check round failed")
            await asyncio.sleep(self.config.health_check_interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
