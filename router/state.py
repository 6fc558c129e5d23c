"""Everything one router instance holds, built once from a :class:`RouterConfig`.

Handlers get this object; tests build it with their own clock or policy.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from radix_global import __version__
from radix_global.types import PoolId
from router.admission_ledger import AdmissionLedger
from router.cluster.dispatcher import Dispatcher
from router.cluster.domain_copies import DomainCopies
from router.cluster.health import HealthMonitor
from router.cluster.index_link import ClusterIndex, open_index
from router.cluster.load_reports import LoadReports
from router.cluster.lost_hosts import LostHosts
from router.cluster.places import Places
from router.cluster.profiling import Profiler
from router.cluster.registry import Source, WorkerEntry, WorkerRegistry
from router.cluster.slots import SlotTables
from router.cluster.warming import HotPrefixWarmer
from router.config import RouterConfig
from router.coordination.view import LoadView
from router.economics import Economics
from router.keying.alias_book import AliasBook
from router.keying.lora import configured_extra_keys
from router.keying.prefix_specs import specs_from_mapping
from router.keying.shared_prefixes import SharedPrefixes
from router.keying.tenants import SHARED_PREFIXES_TABLE, Tenants, read_tenants_file
from router.keying.tokenize import TokenizerCache
from router.metrics import RouterMetrics
from router.pd.pool_front import PdFront
from router.pd.protocol import PdMode, PdUtilization
from router.routing.contract import RoutingPolicy
from router.routing.cost import CostModel
from router.routing.decode_select import DecodeSelector
from router.routing.driver import PolicyDriver
from router.routing.policies import get_policy
from router.transport.proxy import Proxy
from router.transport.request_ids import RequestIds

log = logging.getLogger("radix_global.router")
UNSAFE_SHARE_ENV = "RADIX_GLOBAL_UNSAFE_SHARE_PAST_PREFIX"


def _quiet_load(tok: Any) -> None:
    try:
        tok.load()
    except Exception as exc:  # reported again, per request, when the tokenizer is needed
        log.warning("tokenizer %s failed to load: %r", tok.path, exc)


def key_mismatch(entry: WorkerEntry, min_requests: int) -> bool:
    """The engine never reported a hit on requests the router routed for a cached prefix."""
    return entry.expected_hits >= min_requests and entry.observed_hits == 0


class RouterState:
    def __init__(self, config: RouterConfig, *, policy: RoutingPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.metrics = RouterMetrics()
        self.metrics.key_mismatch = lambda: [
            (e.info.worker_id, key_mismatch(e, config.mismatch.min_requests))
            for e in self.registry.all()]
        # adapter name -> SGLang's key
        self.lora_extra_keys = configured_extra_keys(config.keying.lora_paths)
        self.index: ClusterIndex = open_index(
            config.index.url, config.admin.resolved_token(),
            lora_extra_keys=self.lora_extra_keys, snapshot_path=config.index.snapshot,
            snapshot_interval_s=config.index.snapshot_interval_s,
            restore_grace_s=config.health.heartbeat_timeout_s, clock=clock)
        self.index.bind_metrics(self.metrics.registry)
        self.economics = Economics(self.metrics.registry)
        self.admission = AdmissionLedger(self.metrics.registry, clock,
                                         lambda: len(self.registry))
        # One SLO for the conductor's TTFT admission and the driver's decode admission (no
        # decode worker meeting the TBT SLO -> 429); the cost model and decode selection from
        # the same config (each part gets its section of it).
        slo = config.slo
        policy = policy or get_policy(config.policy.name, slo, **config.policy.options)
        gate = config.dispatch.gate()
        if gate is not None and not policy.places_by_state:
            log.warning("dispatch %r is off with policy %r: it picks by turn or draw, not by "
                        "the engines' state (docs/interfaces.md, \"Router-side dispatch: "
                        "holding requests while the engines are busy\")", config.dispatch.order,
                        policy.name)
            gate = None
        # where hosts are, from the workers' registrations (docs/interfaces.md, "Where hosts are")
        self.places = Places(config.topology, config.cost.remote_segment_bandwidth_Bps,
                             config.cost.default_bandwidth_Bps)
        self.routing = PolicyDriver(
            policy, CostModel(config.cost, self.places.topology), self.index.view,
            decode=DecodeSelector(config.decode), slo=slo, gate=gate)
        self.lost_hosts = LostHosts()
        self.registry = WorkerRegistry(on_added=self._worker_added,
                                       on_removed=self._worker_removed)
        self.loads = LoadReports(self.places)
        self.loads.bind_metrics(self.metrics.registry)
        self.routing.on_fetch = lambda req, decision, now: self.loads.fetch_planned(
            self._pool_of(decision.worker_id), req, decision, now)
        self.dispatcher = (Dispatcher(gate, self.routing, self.registry, self.metrics, clock,
                                      config=config.dispatch)
                           if gate is not None else None)
        self.proxy = Proxy(config.proxy)
        self.health = HealthMonitor(self.registry, config.health, self.proxy.client,
                                    clock=clock, models=config.models,
                                    on_change=self.refresh_gauges,
                                    on_alive=self.worker_alive, busy=self._busy,
                                    on_dead=self._worker_dead,
                                    may_expire=lambda: not self.view.degraded)
        self.health.bind_metrics(self.metrics.registry)
        self.warmer = HotPrefixWarmer(self.index, self.registry, self.proxy.client,
                                      self.routing.cost.outstanding, config.warm,
                                      config.join_warm, clock=clock)
        self.warmer.bind_metrics(self.metrics.registry)
        # hot prefixes copied into other fault domains (docs/interfaces.md, "Where hosts are")
        self.copies = DomainCopies(config.copies, self.index, self.registry, self.places,
                                   self.warmer.prefixes, clock=clock)
        self.copies.bind_metrics(self.metrics.registry)
        self.warmer.keep_prompts = self.copies.enabled
        self.tokenizers = TokenizerCache()
        tenants_file = read_tenants_file(config.keying.tenants_file)
        self.tenants = Tenants.from_mapping(tenants_file)
        share_past = os.environ.get(UNSAFE_SHARE_ENV) == "1"
        if share_past:
            log.warning("%s=1: requests share everything after a registered prefix, so tenants "
                        "see each other's conversations (a test's negative control only)",
                        UNSAFE_SHARE_ENV)
        self.shared_prefixes = SharedPrefixes(
            specs_from_mapping(tenants_file.get(SHARED_PREFIXES_TABLE)), share_past)
        # what workers' pool backends ask (docs/interfaces.md,
        # "Shared platform prefixes across isolated tenants")
        self.aliases = AliasBook()
        # Prefill/decode disaggregation: the pool hand-off's state in pool mode; the busy-time
        # tracker of the utilisation report in either mode.
        self.pd_pool: PdFront | None = None
        if config.pd.mode == PdMode.POOL:
            self.pd_pool = PdFront(self.proxy, self.proxy.client, config.pd,
                                   self.routing.decode, lambda: self.index.view,
                                   self.routing.slo.tbt_slo_s, clock,
                                   on_refused=self.health.connect_failed,
                                   on_answered=self.health.connect_ok)
            self.pd_util = self.pd_pool.orch.util
        else:
            self.pd_util = PdUtilization(config.pd)
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=200)
        self.totals: collections.Counter[str] = collections.Counter()
        self.request_ids = RequestIds()
        self.started_clock = clock()
        # Beyond this router: the other routers' load and the engines' own reports; with a
        # coordination service, membership and shared state too (router/coordination/).
        self.view = LoadView(
            config.coordination, config.engine_load, registry=self.registry,
            driver=self.routing, client=self.proxy.client, prefixes=self.shared_prefixes,
            aliases=self.aliases, profile=lambda entry, coef: self.profiler.shared(entry, coef),
            links=self.places,
            heartbeat_ttl_s=config.health.heartbeat_timeout_s,
            router_id=config.coordination.router_id
            or f"{socket.gethostname()}:{config.listen.port}",
            version=__version__, digest=config.digest(), clock=clock)
        self.view.engines.bind_metrics(self.metrics.registry)
        # each model's slots, kept between decisions, with the view laid over the loaded ones
        self.slots = SlotTables(self.registry, self.view)
        self.warmer.leads = self.copies.leads = self.view.leads
        self.profiler = Profiler(config.profiling, self.routing.cost, self.registry,
                                 self.proxy.client, self.view, config.models.page_size,
                                 timeout_s=config.health.health_check_timeout_s * 4)

    def worker_alive(self, worker_id: str) -> None:
        """A heartbeat or a passed health check: the index and the shared record hear of it."""
        self.index.heartbeat(worker_id)
        if self.view.writes is not None:
            self.view.writes.worker_alive(worker_id)

    def _pool_of(self, worker_id: str | None) -> str | None:
        entry = self.registry.find(worker_id) if worker_id is not None else None
        return entry.info.pool_id if entry is not None else None

    def _busy(self, worker_id: str) -> bool:
        entry = self.registry.find(worker_id)
        if entry is None:
            return False
        return any(self.routing.cost.outstanding((entry.worker_id, r)) > 0
                   for r in range(entry.info.dp_size))

    def _worker_added(self, entry: WorkerEntry) -> None:
        self.index.check(entry)
        self.index.worker_added(entry)
        self.prewarm(entry)
        self.routing.cost.share_compute(entry.worker_id, entry.info.compute_domain)
        self.places.joined(entry.info)
        self.lost_hosts.joined(entry.info)
        if entry.info.pool_disk_id and entry.info.pool_disk_read_Bps:  # a disk tier's speed
            self.routing.cost.set_holder_bandwidth(PoolId(entry.info.pool_disk_id),
                                                   entry.info.pool_disk_read_Bps)
        if entry.info.pool_load_Bps:  # its engine's own load path, measured by the wrapper
            self.routing.cost.set_load_bandwidth(entry.worker_id, entry.info.pool_load_Bps)
        if entry.info.kv_bytes_per_token is not None:  # else the configured default prices it
            self.routing.cost.set_kv_bytes_per_token(entry.info.namespace,
                                                     entry.info.kv_bytes_per_token)
        self.profiler.joined(entry)
        if entry.source is Source.CLI:
            self.view.admitted(entry)
        self.warmer.joined(entry)
        self.refresh_gauges()

    def prewarm(self, entry: WorkerEntry) -> None:
        """Load the model's tokenizer in the background (importing transformers takes seconds),
        so the first request does not pay for it."""
        path = self.config.models.model_path or entry.model_path
        if path:
            tok = self.tokenizers.get(path)
            threading.Thread(target=_quiet_load, args=(tok,), daemon=True).start()

    def _worker_removed(self, entry: WorkerEntry) -> None:
        self.profiler.left(entry.info.worker_id)
        self.index.worker_removed(entry)
        self.routing.worker_removed(entry.worker_id)
        self.places.left(entry.worker_id)
        self.lost_hosts.left(entry.info, [e.info for e in self.registry.all()])
        self.view.worker_removed(entry.worker_id)
        log.info("worker %s left; its index entries were dropped", entry.info.worker_id)
        self.refresh_gauges()

    def _worker_dead(self, entry: WorkerEntry) -> None:
        """A worker removed as dead: its host may be gone without closing a connection, so the
        requests it carries would wait for the read timeout; they end now (retried elsewhere
        when nothing was answered yet). Not while another entry serves the same URL."""
        if any(e.info.url == entry.info.url for e in self.registry.all()):
            return
        writes = self.view.writes
        if writes is not None and writes.owns(entry.info.worker_id):  # gone for every router
            writes.worker_removed(entry.info.worker_id)
        broken = self.proxy.break_worker(entry.info.url, f"worker {entry.worker_id} left the "
                                         "cluster (no heartbeat, failed health checks or "
                                         "refused connections)")
        if broken:
            log.warning("ended %d connections to dead worker %s", broken, entry.worker_id)

    def pd_report(self) -> dict[str, Any] | None:
        """The PD utilisation report, or None while no PD request was seen."""
        if self.pd_pool is not None:
            return self.pd_pool.report()
        util = self.pd_util
        return util.report(self.clock()).to_json(util.config.mode) if util.seen else None

    def refresh_gauges(self) -> None:
        counts: collections.Counter[str] = collections.Counter(
            e.info.model for e in self.registry.all())
        self.metrics.workers.clear()
        for model, n in counts.items():
            self.metrics.workers.labels(model).set(n)

    async def start(self) -> None:
        await self.index.start()
        await self.view.start()  # the shared membership first: workers others admitted
        for url in self.config.health.workers:
            await self.health.discover(url)
        self.health.start()
        self.warmer.start()
        self.copies.start()

    async def stop(self) -> None:
        self.profiler.stop()
        await self.warmer.stop()
        await self.copies.stop()
        await self.view.stop()
        await self.health.stop()
        await self.index.stop()
        await self.proxy.close()
