"""``radix-global router``: start the Conductor in front of SGLang (or other) workers.

Defaults come from :class:`router.config.RouterConfig`; ``--config FILE`` (YAML/TOML) overrides
them and explicit flags override the file::

    radix-global router --workers http://127.0.0.1:30000 http://127.0.0.1:30001 \\
        --policy conductor --port 30080
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from router.config import ConfigError, RouterConfig, load_config_file

_DEFAULTS = RouterConfig()


def build_parser() -> argparse.ArgumentParser:
    d = _DEFAULTS
    p = argparse.ArgumentParser(prog="radix-global router", description=__doc__.splitlines()[0])
    # Every default is SUPPRESS: only flags given on the command line override the config file.
    s = argparse.SUPPRESS
    p.add_argument("--config", help="YAML or TOML file with router options")
    p.add_argument("--host", default=s, help=f"listen address (default {d.host})")
    p.add_argument("--port", type=int, default=s, help=f"listen port (default {d.port})")
    p.add_argument("--workers", nargs="+", default=s, metavar="URL",
                   help="worker base URLs, health-checked over HTTP")
    p.add_argument("--index", dest="index_url", default=s, metavar="URL",
                   help="standalone index service (default: embedded index)")
    p.add_argument("--policy", default=s,
                   help=f"random|round_robin|least_load|approx_cache|conductor ({d.policy})")
    p.add_argument("--admin-token", default=s, help="token for /admin (or env "
                   "RADIX_GLOBAL_ADMIN_TOKEN; none = loopback only)")
    p.add_argument("--model-path", default=s, help="tokenizer/chat template folder")
    p.add_argument("--served-model-name", default=s)
    p.add_argument("--model-version", default=s)
    p.add_argument("--page-size", type=int, default=s)
    p.add_argument("--context-length", type=int, default=s)
    p.add_argument("--tenants-file", default=s, help="API key -> tenant table (TOML/YAML)")
    p.add_argument("--lora-paths", nargs="+", default=s, metavar="NAME=PATH",
                   help="the workers' LoRA adapters, as given to SGLang's --lora-paths")
    p.add_argument("--heartbeat-timeout-s", type=float, default=s,
                   help=f"default {d.heartbeat_timeout_s}")
    p.add_argument("--health-check-interval-s", type=float, default=s,
                   help=f"default {d.health_check_interval_s}")
    p.add_argument("--max-body-bytes", type=int, default=s, help=f"default {d.max_body_bytes}")
    p.add_argument("--request-timeout-s", type=float, default=s)
    p.add_argument("--log-level", default=s, help=f"default {d.log_level}")
    p.add_argument("--profile-max-tokens", type=int, default=s,
                   help="prefill profiling on worker join up to this many tokens; 0 = off "
                        f"(default {d.profile_max_tokens})")
    p.add_argument("--pd-mode", choices=["native", "pool"], default=s,
                   help="prefill/decode hand-off: SGLang's own or through the L3 pool "
                        f"(default {d.pd_mode})")
    p.add_argument("--pd-ratio", default=s, metavar="P:D",
                   help=f"deployed prefill:decode ratio, for the report (default {d.pd_ratio})")
    p.add_argument("--pd-tbt-slo-s", type=float, default=s,
                   help=f"decode TBT SLO; 0 = none (default {d.pd_tbt_slo_s})")
    return p


def config_from_args(argv: list[str]) -> RouterConfig:
    args = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    path = args.pop("config", None)
    if path:
        values.update(load_config_file(path))
    values.update(args)
    return _DEFAULTS.replace(**values)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = config_from_args(argv)
    except ConfigError as exc:
        print(f"radix-global router: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from router.http.app import serve
    from router.state import RouterState

    try:
        state = RouterState(config)
    except (NotImplementedError, ValueError) as exc:
        print(f"radix-global router: {exc}", file=sys.stderr)
        return 2
    serve(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
