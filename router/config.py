"""The router's options: its parts' sections, one config (``docs/interfaces.md``,
"Options: one config source per process").

Every part of the router declares its own options where it lives, as a frozen dataclass (a
*section*) whose fields carry their help and bounds (``Annotated[T, opt(...)]``, choices as
``Literal``): ``DispatchConfig`` (router/routing/dispatch_gate.py), ``SloConfig``, ``CostConfig``,
``DecodeConfig``, ``WarmConfig``, ``JoinWarmConfig``, ``PdConfig``, ``HealthConfig``,
``ModelOverrides``, ``ProxyConfig``, ``ServerLimits``; the router's own top-level options are the
small sections below. :class:`RouterConfig` holds one of each as a typed attribute
(``config.dispatch.timeout_s``, ``config.slo.ttft_slo_s``) and the router hands each part its
object. :data:`SECTIONS` says where each sits and under which prefix its options are named:
the flat names (``dispatch_depth``, ``ttft_slo_s``) are the flags (``--dispatch-depth``), the
environment variables (``RADIX_GLOBAL_DISPATCH_DEPTH``) and the file's keys; ``--help``,
``docs/examples/router.toml`` (:func:`example_config`) and the checks come from the declarations
(``radix_global/options.py``).

Sources, each overriding the one before: the defaults, a file (``--config``, YAML or TOML, flat
keys at top level or under ``[router]``), the environment, command-line flags; see
``router/cli/main.py``. In code: :meth:`RouterConfig.from_options` with flat names.

Names carry their unit: ``_s`` seconds, ``_bytes`` bytes, ``_tokens`` tokens, ``_pages`` pages,
rates ``_per_s``; a 0 SLO or interval means "off". Exceptions are SGLang's own names, in tokens:
``page_size``, ``context_length``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from radix_global.options import (
    Option,
    OptionError,
    Section,
    all_options,
    build,
    check_names,
    example_toml,
    opt,
)
from radix_global.options import load_config_file as options_file
from router.cluster.copy_planner import CopyConfig
from router.cluster.discovery import ModelOverrides
from router.cluster.engine_loads import EngineLoadConfig
from router.cluster.health import HealthConfig
from router.cluster.places import TopologyConfig
from router.cluster.profiling import ProfilingConfig
from router.cluster.replication import WarmConfig
from router.cluster.warming import JoinWarmConfig
from router.coordination.config import CoordinationConfig
from router.keying.lora import parse_lora_paths
from router.pd.protocol import PdConfig
from router.routing.admission import SloConfig
from router.routing.cost import CostConfig
from router.routing.decode_select import DecodeConfig
from router.routing.dispatch_gate import DispatchConfig
from router.routing.policies import check_policy
from router.transport.http_server import ServerLimits
from router.transport.proxy import ProxyConfig

ENV_PREFIX = "RADIX_GLOBAL_"
# SLOs are ``float | None`` (> 0 when set); a 0 from a file, the environment or a flag means
# none, as it always has (compatibility), and is read as None.
ZERO_IS_UNSET = ("ttft_slo_s", "pd_tbt_slo_s")


class ConfigError(OptionError):
    """An unknown option, a bad value, or an unreadable config file: one line."""


# --- the router's own top-level options ------------------------------------------------------

@dataclass(frozen=True)
class ListenConfig:
    """The router's own: where it listens, how much it logs."""

    host: Annotated[str, opt("listen address")] = "127.0.0.1"
    port: Annotated[int, opt("listen port (0: any free one)", ge=0, le=65535)] = 30080
    metrics_port: Annotated[int | None, opt(
        "serve /metrics on this port of the listen address, and not on the client port",
        ge=1, le=65535)] = None
    log_level: Annotated[Literal["debug", "info", "warning", "error", "critical"], opt(
        "log level (any case)")] = "info"

    def __post_init__(self) -> None:
        if self.metrics_port is not None and self.metrics_port == self.port:
            raise ValueError(f"metrics_port must differ from port ({self.port})")


@dataclass(frozen=True)
class IndexConfig:
    """The cluster index: a standalone service, or the embedded one.

    The embedded index's snapshot (docs/interfaces.md, "The router's index snapshot") is restored at
    start, written every ``snapshot_interval_s`` and at shutdown."""

    url: Annotated[str | None, opt(
        "standalone index service (default: embedded index)", aliases=("--index",),
        metavar="HOST:PORT")] = None
    snapshot: Annotated[str | None, opt(
        "embedded index: restore from this file at start, save it at shutdown")] = None
    snapshot_interval_s: Annotated[float, opt(
        "also save the index snapshot every this many seconds; 0 = only at shutdown",
        ge=0)] = 60.0

    def __post_init__(self) -> None:
        if self.snapshot and self.url:
            raise ValueError("index_snapshot is for the embedded index; with index_url the index "
                             "service keeps its own (radix-global index serve --snapshot PATH)")
        if self.snapshot_interval_s < 0:
            raise ValueError(f"index_snapshot_interval_s must be >= 0, got "
                             f"{self.snapshot_interval_s}")


PolicyName = Literal["random", "round_robin", "least_load", "approx_cache", "conductor"]


@dataclass(frozen=True)
class PolicyConfig:
    """The routing policy (router/routing/policies) and its options.

    The options are checked against the policy's constructor at start."""

    name: Annotated[PolicyName, opt("routing policy", name="policy")] = "conductor"
    options: Annotated[dict[str, Any], opt(
        "the policy's options as KEY=VALUE (e.g. fetch_ratio=1.5)", metavar="KEY=VALUE")
    ] = field(default_factory=dict)

    def __post_init__(self) -> None:
        moved = sorted(set(self.options) & set(option_names()))
        if moved:
            raise ValueError(f"{', '.join(moved)}: a router option, not a policy option "
                             "(set it at top level / --" + moved[0].replace("_", "-") + ")")
        object.__setattr__(self, "options", check_policy(self.name, self.options))


@dataclass(frozen=True)
class AdminConfig:
    """The admin API (/admin)."""

    token: Annotated[str | None, opt("token for /admin (unset: loopback clients only)")] = None

    def resolved_token(self) -> str | None:
        # A config built in code (not through the CLI, which reads the environment for every
        # option) still honours the documented variable.
        return self.token or os.environ.get(ENV_PREFIX + "ADMIN_TOKEN") or None


@dataclass(frozen=True)
class KeyingConfig:
    """Keying: tenants and the workers' LoRA adapters.

    Tenants: router/keying/tenants.py. Requests naming a LoRA adapter are keyed exactly as SGLang
    keys them (router/keying/lora.py, docs/interfaces.md, "Page keys")."""

    tenants_file: Annotated[str | None, opt("API key -> tenant table (TOML/YAML)")] = None
    lora_paths: Annotated[dict[str, str], opt(
        "the workers' LoRA adapters as NAME=PATH, as given to SGLang's --lora-paths",
        metavar="NAME=PATH")] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_paths", parse_lora_paths(self.lora_paths))


@dataclass(frozen=True)
class MismatchConfig:
    """Disagreement detection (metric + /admin/diagnostics)."""

    min_requests: Annotated[int, opt(
        "expected hits before a worker that never hits is flagged", ge=1)] = 20


SECTIONS: tuple[Section, ...] = (
    Section("listen", ListenConfig),
    Section("health", HealthConfig),
    Section("index", IndexConfig, "index_"),
    Section("policy", PolicyConfig, "policy_"),
    Section("admin", AdminConfig, "admin_"),
    Section("models", ModelOverrides),
    Section("keying", KeyingConfig),
    Section("proxy", ProxyConfig),
    Section("client", ServerLimits, "client_"),
    Section("mismatch", MismatchConfig, "mismatch_"),
    Section("cost", CostConfig),
    Section("topology", TopologyConfig, "topology_"),
    Section("copies", CopyConfig, "copies_"),
    Section("profiling", ProfilingConfig, "profile_"),
    Section("slo", SloConfig),
    Section("dispatch", DispatchConfig, "dispatch_"),
    Section("decode", DecodeConfig, "decode_"),
    Section("pd", PdConfig, "pd_"),
    Section("warm", WarmConfig, "warm_"),
    Section("join_warm", JoinWarmConfig, "join_warm_"),
    Section("coordination", CoordinationConfig, "coordination_"),
    Section("engine_load", EngineLoadConfig, "engine_load_"),
)
# Options that may differ between routers sharing one view (where each listens, what it logs,
# its own files and secrets); every other option must be equal (RouterConfig.digest).
PER_ROUTER = frozenset({"host", "port", "metrics_port", "log_level", "admin_token",
                        "index_snapshot", "profiles_file", "workers", "coordination_url",
                        "coordination_router_id"})


@functools.cache
def options() -> tuple[Option, ...]:
    """Every router option, in :data:`SECTIONS` order."""
    return tuple(all_options(SECTIONS))


@functools.cache
def option_names() -> frozenset[str]:
    return frozenset(o.name for o in options())


@dataclass(frozen=True)
class RouterConfig:
    """The router's options, one section per part (see the module docstring)."""

    listen: ListenConfig = field(default_factory=ListenConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    models: ModelOverrides = field(default_factory=ModelOverrides)
    keying: KeyingConfig = field(default_factory=KeyingConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    client: ServerLimits = field(default_factory=ServerLimits)
    mismatch: MismatchConfig = field(default_factory=MismatchConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    copies: CopyConfig = field(default_factory=CopyConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    pd: PdConfig = field(default_factory=PdConfig)
    warm: WarmConfig = field(default_factory=WarmConfig)
    join_warm: JoinWarmConfig = field(default_factory=JoinWarmConfig)
    coordination: CoordinationConfig = field(default_factory=CoordinationConfig)
    engine_load: EngineLoadConfig = field(default_factory=EngineLoadConfig)

    @classmethod
    def from_options(cls, **values: Any) -> RouterConfig:
        """A config from flat-named options (``ttft_slo_s=2``, ``dispatch="fifo"``; ``-`` read as
        ``_``, aliases as their option); absent ones take their defaults. Values may be text (as
        from the environment or flags). :class:`ConfigError` names an unknown option or the first
        bad value."""
        try:
            flat = check_names(options(), values, "router")
            for name in ZERO_IS_UNSET:
                if name in flat and _is_zero(flat[name]):
                    flat[name] = None
            return cls(**{s.attr: build(s, flat) for s in SECTIONS})
        except OptionError as exc:
            raise ConfigError(str(exc)) from None

    def to_options(self) -> dict[str, Any]:
        """Every option's value by its flat name (what :meth:`from_options` takes)."""
        return {o.name: getattr(getattr(self, o.section), o.field) for o in options()}

    def digest(self) -> str:
        """What routers sharing a view must agree on: a hash of every option but
        :data:`PER_ROUTER` (the tenants file by its content, not its path)."""
        shared = {k: v for k, v in self.to_options().items() if k not in PER_ROUTER}
        if self.keying.tenants_file:
            with contextlib.suppress(OSError):  # unreadable: the router fails on it at start
                shared["tenants_file"] = hashlib.sha256(
                    Path(self.keying.tenants_file).read_bytes()).hexdigest()
        text = json.dumps(shared, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> RouterConfig:
        """This config with the flat-named options ``changes`` changed, checked again."""
        try:
            changed = check_names(options(), changes, "router")
        except OptionError as exc:
            raise ConfigError(str(exc)) from None
        return RouterConfig.from_options(**{**self.to_options(), **changed})


def _is_zero(value: Any) -> bool:
    if isinstance(value, str):
        try:
            return float(value) == 0
        except ValueError:
            return False
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def example_config() -> str:
    """``docs/examples/router.toml``: every option, its help, bounds and default."""
    return example_toml(
        "radix-global router --config FILE: each key is also --<key-with-dashes> and "
        f"{ENV_PREFIX}<KEY>",
        SECTIONS, skip=("admin_token",))


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Option values from a YAML (.yaml/.yml) or TOML (.toml) file: flat names at top level or
    under a ``router`` table (names checked)."""
    try:
        return options_file(path, "router", options(), "router")
    except OptionError as exc:
        raise ConfigError(str(exc)) from None


def config_from_file(path: str | Path) -> RouterConfig:
    return RouterConfig.from_options(**load_config_file(path))


__all__ = ["ENV_PREFIX", "SECTIONS", "AdminConfig", "ConfigError", "IndexConfig",
           "KeyingConfig", "ListenConfig", "MismatchConfig", "PolicyConfig", "ProfilingConfig",
           "RouterConfig", "config_from_file", "example_config",
           "load_config_file", "option_names", "options"]
