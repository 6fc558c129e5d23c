"""``radix-global router``: start the Conductor in front of SGLang (or other) workers.

Every field of :class:`router.config.RouterConfig` is a flag ``--<field-with-dashes>`` and an
environment variable ``RADIX_GLOBAL_<FIELD>``. Each source overrides the one before: the
defaults, ``--config FILE`` (YAML/TOML), the environment, the flags::

    radix-global router --workers http://127.0.0.1:30000 http://127.0.0.1:30001 \\
        --policy conductor --ttft-slo-s 2 --port 30080

In the environment a list is split on spaces or commas (``RADIX_GLOBAL_WORKERS="URL URL"``), a
table is ``KEY=VALUE`` items (``RADIX_GLOBAL_POLICY_OPTIONS="fetch_ratio=1.5 price_top_k=4"``), a
switch is ``1/0``, ``true/false``, ``yes/no`` or ``on/off``, and an empty optional value is unset.
A bad option, value or file is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tomllib
import types
import typing
from collections.abc import Mapping
from typing import Any, NoReturn

from radix_global_cli import package_version
from router.config import FIELDS, ConfigError, RouterConfig, load_config_file

_DEFAULTS = RouterConfig()
_HINTS: dict[str, Any] = typing.get_type_hints(RouterConfig)
ENV_PREFIX = "RADIX_GLOBAL_"
ALIASES = {"workers": ["--worker-urls"], "index_url": ["--index"]}  # sglang-router's; older name
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}

_HELP = {
    "host": "listen address", "port": "listen port",
    "workers": "worker base URLs (URL[#field=value&...]), health-checked over HTTP",
    "index_url": "standalone index service (default: embedded index)",
    "index_snapshot": "embedded index: restore from this file at start, save it at shutdown",
    "join_warm_pages": "pages of hot prefixes sent to a joining worker; 0 = off",
    "join_warm_timeout_s": "time budget of a joining worker's pre-warming",
    "index_snapshot_interval_s": "also save the index snapshot every this many seconds; 0 = off",
    "policy": "random | round_robin | least_load | approx_cache | conductor",
    "policy_options": "the policy's options as KEY=VALUE (e.g. fetch_ratio=1.5)",
    "admin_token": "token for /admin (unset: loopback clients only)",
    "log_level": "debug | info | warning | error",
    "model_path": "tokenizer/chat template folder of command-line workers",
    "served_model_name": "model name of command-line workers (default: theirs)",
    "model_version": "namespace version (default: hash of the model's config.json)",
    "page_size": "tokens per KV page (default: the worker's)",
    "context_length": "prompt limit in tokens (default: the model's)",
    "tenants_file": "API key -> tenant table (TOML/YAML)",
    "lora_paths": "the workers' LoRA adapters as NAME=PATH, as given to SGLang's --lora-paths",
    "heartbeat_timeout_s": "a registered worker silent this long is removed",
    "health_check_interval_s": "seconds between health checks of command-line workers",
    "health_check_timeout_s": "a health check's timeout",
    "health_failures_to_remove": "failed checks in a row that remove a worker",
    "connect_timeouts_to_remove": "connect timeouts in a row that remove a worker",
    "connect_refusals_to_remove": "refused connections in a row that remove a worker",
    "connect_timeout_s": "connect timeout to a worker",
    "request_timeout_s": "timeout of a forwarded request",
    "max_retries": "other workers tried when one refuses the connection",
    "max_body_bytes": "largest request body accepted",
    "max_connections": "connection pool size to the workers",
    "client_header_timeout_s": "a client's request head must arrive within this",
    "client_body_timeout_s": "... and its body within this of the head",
    "client_keep_alive_s": "idle keep-alive client connections are closed after this",
    "client_max_connections": "concurrent client connections; beyond: 503",
    "mismatch_min_requests": "expected hits before a worker that never hits is flagged",
    "engine_queue_weight": "blend of the engine-reported queue vs the router's estimate, in [0, 1]",
    "kv_bytes_per_token": "KV bytes per token of a namespace whose workers report none",
    "default_bandwidth_bytes_per_s": "pool -> worker bandwidth where the topology says nothing",
    "remote_segment_bandwidth_bytes_per_s": "a shared store's segment on another host -> worker "
                                            "(docs/interfaces.md s. 14)",
    "transfer_overhead_s": "fixed cost of one pool fetch",
    "learn_from_inferred_prefill": "refit profiled workers on FIFO-inferred prefill times too",
    "drag_half_life": "learn what the requests a worker has add to a first token; a "
                      "measured TTFT weighs half after this many more; 0 = off",
    "profile_max_tokens": "prefill profiling on worker join up to this many tokens; 0 = off",
    "profile_sizes": "input lengths profiled",
    "ttft_slo_s": "TTFT SLO: 429 for what is predicted to miss it; 0 = none; a request's own "
                  "ttft_slo_s may only tighten it",
    "ttft_headroom": "fraction of the TTFT SLO kept back for what the cost model does not see",
    "min_retry_after_s": "smallest Retry-After of a 429", "max_retry_after_s": "largest one",
    "pd_tbt_slo_s": "decode TBT SLO; 0 = none",
    "dispatch": "hold streaming requests while the engines are busy, send them: off | fifo | "
                "shortest_first | highest_ratio",
    "dispatch_depth": "requests per engine without a first token before the router holds more",
    "dispatch_max_hold_s": "shortest_first: a request held this long goes first",
    "dispatch_timeout_s": "a request held this long is answered 503, never sent; held half of "
                          "it, before every request held less",
    "dispatch_max_held": "requests held at most; beyond, 503 with Retry-After at once",
    "dispatch_max_held_bytes": "request body bytes held at most; beyond, 503 at once",
    "decode_tbt_base_s": "predicted time between tokens of an empty decode batch",
    "decode_tbt_per_request_s": "... plus this per request in the batch",
    "decode_default_output_tokens": "output tokens reserved for a request without a hint",
    "pd_mode": "prefill/decode hand-off: native (SGLang's) or pool (through the L3 pool)",
    "pd_ratio": "deployed prefill:decode ratio P:D, for the utilisation report",
    "pd_pool_ready_timeout_s": "pool hand-off: wait this long for the prefill's pages",
    "pd_pool_ready_poll_s": "pool hand-off: poll the index this often",
    "pd_decode_attempts": "decode workers tried per request when one fails",
    "warm_interval_s": "hot-prefix warming round every this many seconds; 0 = off",
    "warm_min_hit_rate_per_s": "warm prefixes at least this hot (decayed hits per second)",
    "warm_min_pages": "... and at least this long",
    "warm_max_replicas": "... held by fewer slots than this",
    "warm_busy_margin": "... whose holders all have this many more requests than the lightest",
    "warm_rate_pages_per_s": "warming rate (token bucket refill)",
    "warm_burst_pages": "warming burst (token bucket size)",
    "warm_cooldown_s": "no second warm of one prefix on one slot within this",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + error
        raise ConfigError(f"{message} (see --help)")


def _inner(hint: Any) -> Any:
    """``X`` of ``X | None``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and args else hint


def _scalar(text: str) -> Any:
    """A policy option's value: a TOML value (number, true/false, "string") or else the text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _table(items: list[str], name: str) -> dict[str, Any]:
    """``KEY=VALUE`` items as a table of :func:`_scalar` values (policy options)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{name}: {item!r} is not KEY=VALUE")
        out[key] = _scalar(value)
    return out


def parse_text(name: str, text: str) -> Any:
    """The value of field ``name`` written as text (an environment variable)."""
    hint = _HINTS[name]
    optional = _inner(hint) is not hint
    inner = _inner(hint)
    origin = typing.get_origin(inner)
    if optional and text.strip() == "":
        return None
    if origin is tuple:
        return [t for t in re.split(r"[\s,]+", text.strip()) if t]
    if origin is dict:  # lora_paths: SGLang's NAME=PATH items, read by parse_lora_paths
        items = text.split()
        return _table(items, name) if name == "policy_options" else items
    if inner is bool:
        if text.strip().lower() not in _TRUE | _FALSE:
            raise ConfigError(f"{name} must be one of 1/0, true/false, yes/no, on/off: {text!r}")
        return text.strip().lower() in _TRUE
    try:
        return inner(text) if inner in (int, float) else text
    except ValueError:
        raise ConfigError(f"{name} must be {inner.__name__}, got {text!r}") from None


def env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """Options set as ``RADIX_GLOBAL_<FIELD>`` in ``environ``."""
    return {name: parse_text(name, environ[key]) for name in FIELDS
            if (key := ENV_PREFIX + name.upper()) in environ}


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="radix-global router", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"radix-global {package_version()}")
    p.add_argument("--config", help="YAML or TOML file with router options")
    # Every default is SUPPRESS: only flags given on the command line override file and env.
    for name in FIELDS:
        hint, default = _inner(_HINTS[name]), getattr(_DEFAULTS, name)
        flags = [f"--{name.replace('_', '-')}", *ALIASES.get(name, [])]
        env = f"env {ENV_PREFIX}{name.upper()}"
        shown = f"; default {default}" if default not in (None, (), {}) else ""
        help_ = f"{_HELP.get(name, name)} ({env}{shown})"
        kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_}
        if hint is bool:
            p.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
        elif typing.get_origin(hint) in (tuple, dict):
            meta = {"workers": "URL", "lora_paths": "NAME=PATH"}.get(name, "KEY=VALUE")
            p.add_argument(*flags, nargs="+", metavar=meta, **kw)
        else:
            meta = {int: "N", float: "X"}.get(hint, "TEXT")
            p.add_argument(*flags, type=hint if hint in (int, float) else str, metavar=meta, **kw)
    return p


def config_from_args(argv: list[str], environ: Mapping[str, str] | None = None) -> RouterConfig:
    """defaults < ``--config`` file < ``environ`` (default: ``os.environ``) < flags."""
    args = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    path = args.pop("config", None)
    if path:
        values.update(load_config_file(path))
    values.update(env_values(os.environ if environ is None else environ))
    if "policy_options" in args:
        args["policy_options"] = _table(args["policy_options"], "policy_options")
    values.update(args)
    return _DEFAULTS.replace(**values)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = config_from_args(argv)
    except ConfigError as exc:
        print(f"radix-global router: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, --version
        return int(exc.code or 0)
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from router.http.app import serve
    from router.state import RouterState

    try:
        state = RouterState(config)
    except (NotImplementedError, ValueError, OSError) as exc:  # e.g. a bad worker URL, no file
        print(f"radix-global router: {exc}", file=sys.stderr)
        return 2
    serve(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
