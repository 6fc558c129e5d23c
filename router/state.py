"""Everything one router instance holds, built once from a :class:`RouterConfig`.

Handlers get this object; tests build it with their own clock or policy.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from radix_global import __version__
from radix_global.types import PoolId, WorkerId
from router.cluster.dispatcher import Dispatcher
from router.cluster.health import HealthMonitor
from router.cluster.index_link import ClusterIndex, open_index
from router.cluster.profile_store import ProfileStore
from router.cluster.profiling import ProfileBook, fit_profile, profile_worker
from router.cluster.registry import Source, WorkerEntry, WorkerRegistry
from router.cluster.warming import HotPrefixWarmer
from router.config import RouterConfig
from router.coordination.view import LoadView
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
from router.routing.prefill_model import PrefillModel
from router.transport.proxy import Proxy

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
        self.routing = PolicyDriver(
            policy, CostModel(config.cost), self.index.view,
            decode=DecodeSelector(config.decode), slo=slo, gate=gate)
        self.registry = WorkerRegistry(on_added=self._worker_added,
                                       on_removed=self._worker_removed)
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
        self.started_clock = clock()
        self.profiles: dict[str, dict[str, Any]] = {}  # worker id -> profiling outcome
        self.profile_book = ProfileBook()
        self.saved_profiles = (ProfileStore(config.profiling.file)
                               if config.profiling.file else None)
        self._profile_tasks: set[asyncio.Task[None]] = set()
        # Beyond this router: the other routers' load and the engines' own reports; with a
        # coordination service, membership and shared state too (router/coordination/).
        self.view = LoadView(
            config.coordination, config.engine_load, registry=self.registry,
            driver=self.routing, client=self.proxy.client, prefixes=self.shared_prefixes,
            aliases=self.aliases, profile=self._shared_profile,
            heartbeat_ttl_s=config.health.heartbeat_timeout_s,
            router_id=config.coordination.router_id
            or f"{socket.gethostname()}:{config.listen.port}",
            version=__version__, digest=config.digest(), clock=clock)
        self.view.engines.bind_metrics(self.metrics.registry)
        self.warmer.leads = self.view.leads

    def worker_alive(self, worker_id: str) -> None:
        """A heartbeat or a passed health check: the index and the shared record hear of it."""
        self.index.heartbeat(worker_id)
        if self.view.writes is not None:
            self.view.writes.worker_alive(worker_id)

    def _shared_profile(self, entry: WorkerEntry, coef: tuple[float, ...]) -> None:
        """A prefill profile another router fitted (the leader profiles joining workers)."""
        if self.profiles.get(entry.info.worker_id, {}).get("state") in ("done", "restored"):
            return
        self.profile_book.joined(entry.info.worker_id, entry.info.namespace)
        self.apply_profile(entry, PrefillModel(prior=coef))
        self.profiles[entry.info.worker_id] = {"state": "shared", "coef": list(coef)}

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
        if entry.info.pool_disk_id and entry.info.pool_disk_read_Bps:  # a disk tier's speed
            self.routing.cost.set_holder_bandwidth(PoolId(entry.info.pool_disk_id),
                                                   entry.info.pool_disk_read_Bps)
        if entry.info.pool_load_Bps:  # its engine's own load path, measured by the wrapper
            self.routing.cost.set_load_bandwidth(entry.worker_id, entry.info.pool_load_Bps)
        if entry.info.kv_bytes_per_token is not None:  # else the configured default prices it
            self.routing.cost.set_kv_bytes_per_token(entry.info.namespace,
                                                     entry.info.kv_bytes_per_token)
        if not self.restore_profile(entry):
            self.inherit_profile(entry)
            if self.view.leads():  # else the leader's profile comes through the service
                self.start_profile(entry)
        if entry.source is Source.CLI:
            self.view.admitted(entry)
        self.warmer.joined(entry)
        self.refresh_gauges()

    def restore_profile(self, entry: WorkerEntry) -> bool:
        """Price a returning worker with the profile fitted before this router restarted."""
        info = entry.info
        coef = self.saved_profiles.get(info.worker_id, info.namespace) \
            if self.saved_profiles is not None else None
        shared = self.view.shared
        if coef is None and shared is not None:  # fitted by the leader, read from the service
            coef = shared.profiles.get((info.worker_id, info.namespace))
        if coef is None:
            return False
        self.profile_book.joined(info.worker_id, info.namespace)
        self.apply_profile(entry, PrefillModel(prior=coef))
        self.profiles[info.worker_id] = {"state": "restored", "coef": list(coef)}
        log.info("worker %s priced with its saved prefill profile %s", info.worker_id, coef)
        return True

    def inherit_profile(self, entry: WorkerEntry) -> None:
        """Price a joining worker like its profiled peers of the same namespace until its own
        profile is fitted (``ProfileBook``); with none, the default prior stays."""
        model = self.profile_book.joined(entry.info.worker_id, entry.info.namespace)
        if model is not None:
            self.routing.cost.set_prefill_model(entry.worker_id, model)
            log.info("worker %s priced with its peers' prefill profile until its own is fitted",
                     entry.info.worker_id)

    def apply_profile(self, entry: WorkerEntry, model: PrefillModel) -> None:
        """Install ``entry``'s own fitted profile; peers still without one inherit it."""
        # learn_from_inferred_prefill is the cost model's (CostConfig, from this config)
        self.routing.cost.set_prefill_model(entry.worker_id, model)
        for wid, inherited in self.profile_book.fitted(entry.info.worker_id, model).items():
            self.routing.cost.set_prefill_model(WorkerId(wid), inherited)

    def start_profile(self, entry: WorkerEntry) -> None:
        """Measure the joining worker's prefill curve in the background
        (``router/cluster/profiling.py``); until it is done the worker is priced with its peers'
        profile (or the default prior)."""
        if self.config.profiling.max_tokens <= 0:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # registered outside the server loop (tests): nothing to run on
            return
        self.profiles[entry.info.worker_id] = {"state": "running"}
        task = loop.create_task(self._profile(entry))
        self._profile_tasks.add(task)
        task.add_done_callback(self._profile_tasks.discard)

    async def _profile(self, entry: WorkerEntry) -> None:
        wid = entry.info.worker_id
        try:
            samples = await profile_worker(
                self.proxy.client, entry.info.url,
                self.config.models.page_size or entry.info.page_size,
                self.config.profiling.max_tokens, self.config.profiling.sizes,
                timeout_s=self.config.health.health_check_timeout_s * 4,
                model=None if entry.info.engine == "sglang" else entry.info.model)
            model = fit_profile(samples)
        except Exception as exc:  # a worker that cannot be profiled keeps the prior
            log.warning("profiling worker %s failed: %r", wid, exc)
            self.profiles[wid] = {"state": "failed", "error": repr(exc)}
            if self.registry.find(wid) is not None:  # an inherited model learns online then
                self.routing.cost.set_prefill_model(
                    entry.worker_id, self.routing.cost.prefill_model(entry.worker_id),
                    learn_inferred=True)
            return
        if self.registry.find(wid) is None:
            return  # left while being profiled
        self.apply_profile(entry, model)
        self.profiles[wid] = {"state": "done", "coef": list(model.coef),
                              "samples": [list(s) for s in samples]}
        if self.saved_profiles is not None:
            self.saved_profiles.put(wid, entry.info.namespace, model.coef)
        if self.view.writes is not None:
            self.view.writes.profile_fitted(wid, entry.info.namespace, model.coef)
        log.info("worker %s profiled: prefill coef %s", wid, model.coef)

    def profiling_pending(self) -> int:
        return sum(1 for p in self.profiles.values() if p.get("state") == "running")

    def prewarm(self, entry: WorkerEntry) -> None:
        """Load the model's tokenizer in the background (importing transformers takes seconds),
        so the first request does not pay for it."""
        path = self.config.models.model_path or entry.model_path
        if path:
            tok = self.tokenizers.get(path)
            threading.Thread(target=_quiet_load, args=(tok,), daemon=True).start()

    def _worker_removed(self, entry: WorkerEntry) -> None:
        self.profile_book.left(entry.info.worker_id)
        self.index.worker_removed(entry)
        self.routing.worker_removed(entry.worker_id)
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

    async def stop(self) -> None:
        for task in list(self._profile_tasks):
            task.cancel()
        await self.warmer.stop()
        await self.view.stop()
        await self.health.stop()
        await self.index.stop()
        await self.proxy.close()
