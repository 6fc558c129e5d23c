"""Every option of the router in one frozen dataclass, checked when it is built.

Sources, each overriding the one before: the defaults below, a file (``--config``, YAML or TOML,
at top level or under ``[router]``), the environment (``RADIX_GLOBAL_<FIELD>``, e.g.
``RADIX_GLOBAL_TTFT_SLO_S=2``), command-line flags (``--<field-with-dashes>``); see
``router/cli/main.py``. Every field is all three; ``docs/examples/router.toml`` lists every field
(``tests/router/test_config.py`` keeps it complete). Nothing else reads options.

Names carry their unit: ``_s`` seconds, ``_bytes`` bytes, ``_tokens`` tokens, ``_pages`` pages,
rates ``_per_s`` / ``_per_token``; a 0 SLO or interval means "off". Exceptions are SGLang's own
names, in tokens: ``page_size``, ``context_length``.

The parts of the router keep their own small frozen configs (``CostConfig``, ``SloConfig``,
``DecodeConfig``, ``WarmConfig``, ``PdConfig``), where their defaults are written once: the fields
here take their defaults from them, and one method each (``cost_config()``, ...) builds them from
this config, so the live router runs on exactly these values. The pure core never imports this
module; this module imports those pure configs.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.cluster.discovery import ModelOverrides
from router.cluster.health import HealthConfig
from router.cluster.replication import WarmConfig
from router.keying.lora import parse_lora_paths
from router.pd.protocol import PdConfig, PdError, PdMode
from router.routing.admission import SloConfig
from router.routing.cost import CostConfig
from router.routing.decode_select import DecodeConfig, TbtModel
from router.routing.dispatch_gate import DispatchConfig
from router.routing.policies import PolicyConfigError, check_policy
from router.routing.policies.options import coerce
from router.transport.http_server import ServerLimits
from router.transport.proxy import ProxyConfig

# The parts' defaults, which the fields below take theirs from.
_COST, _SLO, _DECODE, _WARM, _PD, _DISPATCH = (CostConfig(), SloConfig(), DecodeConfig(),
                                               WarmConfig(), PdConfig(), DispatchConfig())
_SERVER, _PROXY, _HEALTH = ServerLimits(), ProxyConfig(), HealthConfig()


class ConfigError(ValueError):
    """An unknown option, a value of the wrong type, or an unreadable config file."""


@dataclass(frozen=True)
class RouterConfig:
    """Router options (units: see the module docstring)."""

    host: str = "127.0.0.1"
    port: int = 30080
    workers: tuple[str, ...] = ()  # base URLs of workers given on the command line
    index_url: str | None = None  # standalone index service; None = embedded index
    # The embedded index's snapshot (docs/interfaces.md s.18): restored at start, written every
    # index_snapshot_interval_s (0 = only at shutdown) and at shutdown.
    index_snapshot: str | None = None
    index_snapshot_interval_s: float = 60.0
    policy: str = "conductor"
    policy_options: dict[str, Any] = field(default_factory=dict)  # get_policy(**...), checked
    admin_token: str | None = None  # unset: admin API from loopback only
    log_level: str = "info"
    # Models of command-line workers: discovered from each worker's /server_info; these override.
    model_path: str | None = None  # tokenizer/chat-template folder for command-line workers
    served_model_name: str | None = None
    model_version: str | None = None  # namespace version; default: hash of the model's config
    page_size: int | None = None  # override the page size reported by the worker
    context_length: int | None = None  # prompt limit; default: the model config's max positions
    # Tenants: a TOML/YAML file mapping API keys to tenants (see router/keying/tenants.py).
    tenants_file: str | None = None
    # LoRA adapters the workers serve, name -> path as given to SGLang's --lora-paths: the router
    # then keys their requests exactly as SGLang does (router/keying/lora.py, docs/interfaces.md).
    lora_paths: dict[str, str] = field(default_factory=dict)
    # Worker liveness (router/cluster/health.py, HealthConfig): registered workers heartbeat;
    # command-line workers are health-checked. Request-path connect failures: a worker is
    # removed after this many consecutive connect timeouts (retried elsewhere meanwhile) or
    # refused connections.
    heartbeat_timeout_s: float = _HEALTH.heartbeat_timeout_s
    health_check_interval_s: float = _HEALTH.health_check_interval_s
    health_check_timeout_s: float = _HEALTH.health_check_timeout_s
    health_failures_to_remove: int = _HEALTH.health_failures_to_remove
    connect_timeouts_to_remove: int = _HEALTH.connect_timeouts_to_remove
    connect_refusals_to_remove: int = _HEALTH.connect_refusals_to_remove
    # Proxy (router/transport/proxy.py, ProxyConfig).
    connect_timeout_s: float = _PROXY.connect_timeout_s
    request_timeout_s: float = _PROXY.request_timeout_s
    max_retries: int = 2  # other workers tried when a worker refuses the connection
    max_body_bytes: int = 16 * 1024 * 1024
    max_connections: int = _PROXY.max_connections  # pooled connections to the workers
    # Client connections (router/transport/http_server.py, ServerLimits): a request's head and
    # body must arrive within these deadlines, an idle keep-alive connection is closed after
    # client_keep_alive_s, and beyond client_max_connections new requests get 503.
    client_header_timeout_s: float = _SERVER.header_timeout_s
    client_body_timeout_s: float = _SERVER.body_timeout_s
    client_keep_alive_s: int = _SERVER.keep_alive_s
    client_max_connections: int = _SERVER.max_connections
    # Disagreement detection: a worker whose routed requests never hit after this many requests
    # with an expected hit is flagged (metric + /admin/diagnostics).
    mismatch_min_requests: int = 20
    # Cost model (router/routing/cost.py, CostConfig). kv_bytes_per_token: for a namespace whose
    # workers do not report theirs (WorkerInfo.kv_bytes_per_token).
    engine_queue_weight: float = _COST.engine_queue_weight
    kv_bytes_per_token: int = int(_COST.kv_bytes_per_token)
    default_bandwidth_bytes_per_s: float = _COST.default_bandwidth_Bps
    remote_segment_bandwidth_bytes_per_s: float = _COST.remote_segment_bandwidth_Bps
    transfer_overhead_s: float = _COST.transfer_overhead_s
    learn_from_inferred_prefill: bool = _COST.learn_from_inferred_prefill
    drag_half_life: float = _COST.drag_half_life
    # Prefill-model bootstrap (router/cluster/profiling.py): timed 1-token generations up to this
    # many input tokens when a worker joins (at most the engine's KV capacity: a profile that
    # fails keeps the peers' curve); 0 = off (the GPU-like prior until refitted online).
    profile_max_tokens: int = 2048
    profile_sizes: int = 3  # input lengths profiled (halving), each cold and half cached
    # Fitted profiles are saved here and a returning worker (same id and namespace) is priced
    # with its saved one at once, without profiling again (router/cluster/profile_store.py).
    profiles_file: str | None = None
    # Admission (router/routing/admission.py, SloConfig): 429 + Retry-After for what is predicted
    # to miss the TTFT SLO (0 = none; a request's own ttft_slo_s may only tighten it), keeping
    # ttft_headroom of it back for what the cost model does not see; pd_tbt_slo_s: decode
    # admission (0 = none).
    ttft_slo_s: float = _SLO.ttft_slo_s or 0.0
    ttft_headroom: float = _SLO.ttft_headroom
    min_retry_after_s: float = _SLO.min_retry_after_s
    max_retry_after_s: float = _SLO.max_retry_after_s
    pd_tbt_slo_s: float = _SLO.tbt_slo_s or 0.0
    # Router-side dispatch (router/routing/dispatch_gate.py, DispatchConfig; docs/interfaces.md
    # s. 19): hold streaming requests while every engine that could take them has
    # dispatch_depth prefills in flight, and send them off | fifo | shortest_first (held
    # dispatch_max_hold_s or longer: first) | highest_ratio; held dispatch_timeout_s: 503;
    # held half of it: before all others. At most dispatch_max_held requests and
    # dispatch_max_held_bytes of bodies are held; beyond, 503 at once.
    dispatch: str = _DISPATCH.order
    dispatch_depth: int = _DISPATCH.depth
    dispatch_max_hold_s: float = _DISPATCH.max_hold_s
    dispatch_timeout_s: float = _DISPATCH.timeout_s
    dispatch_max_held: int = _DISPATCH.max_held
    dispatch_max_held_bytes: int = _DISPATCH.max_held_bytes
    # Decode selection (router/routing/decode_select.py, DecodeConfig): predicted time between
    # tokens = base + per_request x batch; a request without a hint reserves this much output.
    decode_tbt_base_s: float = _DECODE.tbt.base_s
    decode_tbt_per_request_s: float = _DECODE.tbt.per_request_s
    decode_default_output_tokens: int = _DECODE.default_output_tokens
    # Prefill/decode disaggregation (docs/pd.md, PdConfig), used when a model has prefill- and
    # decode-role workers: "native" = SGLang's PD (bootstrap fields to both workers), "pool" =
    # hand-off through the L3 pool (router/pd/pool_front.py). pd_ratio: the deployed
    # prefill:decode ratio the utilisation report compares against.
    pd_mode: str = "native"
    pd_ratio: str = f"{_PD.prefill_workers}:{_PD.decode_workers}"
    pd_pool_ready_timeout_s: float = _PD.pool_ready_timeout_s
    pd_pool_ready_poll_s: float = _PD.pool_ready_poll_s
    pd_decode_attempts: int = _PD.decode_attempts
    # Hot-prefix warming (router/cluster/warming.py, WarmConfig): planning rounds every this many
    # seconds (0 = off), for prefixes this hot and long, held by fewer than max_replicas slots all
    # busier than the lightest by busy_margin requests; paced by a token bucket of pages.
    warm_interval_s: float = 0.0
    warm_min_hit_rate_per_s: float = _WARM.min_hit_rate
    warm_min_pages: int = _WARM.min_pages
    warm_max_replicas: int = _WARM.max_replicas
    warm_busy_margin: int = _WARM.busy_margin
    warm_rate_pages_per_s: float = _WARM.rate_pages_per_s
    warm_burst_pages: float = _WARM.burst_pages
    warm_cooldown_s: float = _WARM.cooldown_s
    # A joining worker is sent its namespace's hottest prefixes it does not hold, up to this many
    # pages (0 = off) within join_warm_timeout_s (router/cluster/warming.py, interfaces s.18).
    join_warm_pages: int = 0
    join_warm_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        """Types (lists become tuples, ints floats where floats are wanted), choices, the
        policy's options and every part's config, so that a bad value stops the router at
        start with one :class:`ConfigError`."""
        for f in dataclasses.fields(self):
            try:
                value = getattr(self, f.name)
                if f.name == "lora_paths":  # also SGLang's list of NAME=PATH
                    value = parse_lora_paths(value)
                value = coerce(f.name, value, _HINTS[f.name])
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
            object.__setattr__(self, f.name, value)
        if self.index_snapshot and self.index_url:
            raise ConfigError("index_snapshot is for the embedded index; with index_url the index "
                              "service keeps its own (radix-global index serve --snapshot PATH)")
        if self.join_warm_pages < 0 or self.join_warm_timeout_s <= 0:
            raise ConfigError("join_warm_pages must be >= 0 and join_warm_timeout_s > 0")
        if self.index_snapshot_interval_s < 0:
            raise ConfigError(f"index_snapshot_interval_s must be >= 0, got "
                              f"{self.index_snapshot_interval_s}")
        if self.pd_mode not in {m.value for m in PdMode}:
            raise ConfigError(f"pd_mode must be native or pool, got {self.pd_mode!r}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"log_level must be debug, info, warning, error or critical, got "
                              f"{self.log_level!r}")
        moved = sorted(set(self.policy_options) & set(_HINTS))
        if moved:
            raise ConfigError(f"{', '.join(moved)}: a router option, not a policy option "
                              "(set it at top level / --" + moved[0].replace("_", "-") + ")")
        try:
            object.__setattr__(self, "policy_options",
                               check_policy(self.policy, self.policy_options))
            self.cost_config(), self.slo_config(), self.decode_config(), self.warm_config()
            self.pd_config(), self.dispatch_config()
        except (PolicyConfigError, PdError, ValueError) as exc:
            raise ConfigError(str(exc)) from exc

    def cost_config(self) -> CostConfig:
        return CostConfig(engine_queue_weight=self.engine_queue_weight,
                          kv_bytes_per_token=self.kv_bytes_per_token,
                          default_bandwidth_Bps=self.default_bandwidth_bytes_per_s,
                          remote_segment_bandwidth_Bps=self.remote_segment_bandwidth_bytes_per_s,
                          transfer_overhead_s=self.transfer_overhead_s,
                          learn_from_inferred_prefill=self.learn_from_inferred_prefill,
                          drag_half_life=self.drag_half_life)

    def dispatch_config(self) -> DispatchConfig:
        return DispatchConfig(self.dispatch, self.dispatch_depth, self.dispatch_max_hold_s,
                              self.dispatch_timeout_s, self.dispatch_max_held,
                              self.dispatch_max_held_bytes)

    def slo_config(self) -> SloConfig:
        """The one SLO: the conductor's TTFT admission and the driver's decode admission."""
        return SloConfig(ttft_slo_s=self.ttft_slo_s or None, tbt_slo_s=self.pd_tbt_slo_s or None,
                         ttft_headroom=self.ttft_headroom,
                         min_retry_after_s=self.min_retry_after_s,
                         max_retry_after_s=self.max_retry_after_s)

    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(tbt=TbtModel(self.decode_tbt_base_s, self.decode_tbt_per_request_s),
                            default_output_tokens=self.decode_default_output_tokens)

    def warm_config(self) -> WarmConfig:
        return WarmConfig(min_hit_rate=self.warm_min_hit_rate_per_s,
                          min_pages=self.warm_min_pages, max_replicas=self.warm_max_replicas,
                          busy_margin=self.warm_busy_margin,
                          rate_pages_per_s=self.warm_rate_pages_per_s,
                          burst_pages=self.warm_burst_pages, cooldown_s=self.warm_cooldown_s)

    def pd_config(self) -> PdConfig:
        return PdConfig.parse_ratio(self.pd_ratio, mode=PdMode(self.pd_mode),
                                    pool_ready_timeout_s=self.pd_pool_ready_timeout_s,
                                    pool_ready_poll_s=self.pd_pool_ready_poll_s,
                                    decode_attempts=self.pd_decode_attempts)

    def model_overrides(self) -> ModelOverrides:
        return ModelOverrides(self.model_path, self.served_model_name, self.model_version,
                              self.page_size, self.context_length)

    def health_config(self) -> HealthConfig:
        return HealthConfig(
            workers=self.workers, models=self.model_overrides(),
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            health_check_interval_s=self.health_check_interval_s,
            health_check_timeout_s=self.health_check_timeout_s,
            health_failures_to_remove=self.health_failures_to_remove,
            connect_timeouts_to_remove=self.connect_timeouts_to_remove,
            connect_refusals_to_remove=self.connect_refusals_to_remove)

    def proxy_config(self) -> ProxyConfig:
        return ProxyConfig(self.connect_timeout_s, self.request_timeout_s, self.max_connections)

    def server_limits(self) -> ServerLimits:
        return ServerLimits(header_timeout_s=self.client_header_timeout_s,
                            body_timeout_s=self.client_body_timeout_s,
                            keep_alive_s=self.client_keep_alive_s,
                            max_connections=self.client_max_connections)

    def resolved_admin_token(self) -> str | None:
        # A RouterConfig built in code (not through the CLI, which reads the environment for
        # every field) still honours the documented variable.
        return self.admin_token or os.environ.get("RADIX_GLOBAL_ADMIN_TOKEN") or None

    def replace(self, **changes: Any) -> RouterConfig:
        return dataclasses.replace(self, **check_names(changes))


_HINTS: dict[str, Any] = typing.get_type_hints(RouterConfig)
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RouterConfig))


def check_names(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``-`` in names read as ``_``; :class:`ConfigError` on an unknown name.
    Values are checked when the config is built (``RouterConfig.__post_init__``)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        key = name.replace("-", "_")
        if key not in _HINTS:
            raise ConfigError(f"unknown router option {name!r}")
        if key == "workers" and isinstance(value, str):
            value = [value]
        out[key] = value
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) file into option values (names checked).

    The file may hold the options at top level or under a ``router`` table.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file must end in .toml, .yaml or .yml: {path}")
    except ConfigError:
        raise
    except Exception as exc:  # yaml.YAMLError, tomllib.TOMLDecodeError
        raise ConfigError(f"cannot parse {path}: {exc}".splitlines()[0]) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    if isinstance(data.get("router"), dict):
        data = data["router"]
    return check_names(data)


def config_from_file(path: str | Path) -> RouterConfig:
    return RouterConfig(**load_config_file(path))
