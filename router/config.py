"""Every option of the router in one frozen dataclass.

The CLI (``router/cli/main.py``) takes its defaults from :class:`RouterConfig`, a file (YAML or
TOML,
``--config``) overrides those defaults, and explicit command-line flags override the file. Nothing
else reads options: the app, proxy and registry get a ``RouterConfig``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.keying.lora import parse_lora_paths


class ConfigError(ValueError):
    """An unknown option, a value of the wrong type, or an unreadable config file."""


@dataclass(frozen=True)
class RouterConfig:
    """Router options. Times in seconds, sizes in bytes unless the name says otherwise."""

    host: str = "127.0.0.1"
    port: int = 30080
    workers: tuple[str, ...] = ()  # base URLs of workers given on the command line
    index_url: str | None = None  # standalone index service; None = embedded index
    policy: str = "conductor"
    policy_options: dict[str, Any] = field(default_factory=dict)  # passed to get_policy(**...)
    admin_token: str | None = None  # falls back to env RADIX_GLOBAL_ADMIN_TOKEN
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
    # Worker liveness.
    heartbeat_interval_s: float = 5.0
    heartbeat_timeout_s: float = 20.0
    health_check_interval_s: float = 2.0
    health_check_timeout_s: float = 30.0  # SGLang's /health waits for a 1-token generation
    health_failures_to_remove: int = 3
    # Request-path connect failures (router/cluster/health.py): a worker is removed after this many
    # consecutive connect timeouts (retried elsewhere meanwhile) or refused connections.
    connect_timeouts_to_remove: int = 3
    connect_refusals_to_remove: int = 1
    # Hot-prefix warming (router/cluster/warming.py): planning rounds every this many seconds; 0 =
    # off.
    warm_interval_s: float = 0.0
    # Proxy.
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 600.0
    max_retries: int = 2  # other workers tried when a worker refuses the connection
    max_body_bytes: int = 16 * 1024 * 1024
    max_connections: int = 1024
    # Disagreement detection: a worker whose routed requests never hit after this many requests
    # with an expected hit is flagged (metric + /admin/diagnostics).
    mismatch_min_requests: int = 20
    log_level: str = "info"
    # Prefill-model bootstrap (router/cluster/profiling.py): timed 1-token generations up to this
    # many
    # input tokens when a worker joins; 0 = off (the GPU-like prior until refitted online).
    profile_max_tokens: int = 1024
    profile_sizes: int = 3  # input lengths profiled (halving), each cold and half cached
    # Refit a profiled worker's prefill model on FIFO-inferred service times too (they include a
    # batching engine's waiting, which the fit turns into seconds of fixed cost per queued
    # request). Unprofiled workers (profiling off or failed) always learn from them.
    learn_from_inferred_prefill: bool = False
    # Prefill/decode disaggregation (docs/pd.md), used when a model has prefill- and decode-role
    # workers: "native" = SGLang's PD (bootstrap fields to both workers), "pool" = hand-off
    # through the L3 pool (router/pd/pool_front.py). pd_ratio: the deployed prefill:decode ratio the
    # utilisation report compares against. pd_tbt_slo_s: decode admission (0 = none).
    pd_mode: str = "native"
    pd_ratio: str = "1:1"
    pd_tbt_slo_s: float = 0.0
    pd_pool_ready_timeout_s: float = 10.0

    def resolved_admin_token(self) -> str | None:
        return self.admin_token or os.environ.get("RADIX_GLOBAL_ADMIN_TOKEN") or None

    def replace(self, **changes: Any) -> RouterConfig:
        return dataclasses.replace(self, **_coerce(changes))


_FIELDS = {f.name: f for f in dataclasses.fields(RouterConfig)}


def _coerce(values: dict[str, Any]) -> dict[str, Any]:
    """Check names and types of ``values`` against :class:`RouterConfig`; lists become tuples."""
    out: dict[str, Any] = {}
    defaults = RouterConfig()
    for name, value in values.items():
        key = name.replace("-", "_")
        if key not in _FIELDS:
            raise ConfigError(f"unknown router option {name!r}")
        default = getattr(defaults, key)
        if key == "workers":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise ConfigError("workers must be a list of URLs")
            value = tuple(value)
        elif key == "pd_mode" and value not in ("native", "pool"):
            raise ConfigError(f"pd_mode must be native or pool, got {value!r}")
        elif key == "policy_options":
            if not isinstance(value, dict):
                raise ConfigError("policy_options must be a table/mapping")
        elif key == "lora_paths":
            try:
                value = parse_lora_paths(value)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        elif value is not None and default is not None:
            want = type(default)
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ConfigError(f"{name} must be {want.__name__}, got {value!r}")
        elif value is not None and not isinstance(value, str | int):
            raise ConfigError(f"{name}: unexpected value {value!r}")
        out[key] = value
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) file into checked option values.

    The file may hold the options at top level or under a ``router`` table.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
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
        raise ConfigError(f"cannot parse {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    if isinstance(data.get("router"), dict):
        data = data["router"]
    return _coerce(data)


def config_from_file(path: str | Path) -> RouterConfig:
    return RouterConfig(**load_config_file(path))
