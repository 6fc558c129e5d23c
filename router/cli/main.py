"""``radix-global router``: start the Conductor in front of SGLang (or other) workers.

Every router option (``router/config.py``: each part's section) is a flag
``--<name-with-dashes>`` and an environment variable ``RADIX_GLOBAL_<NAME>``; flags, variables,
``--help`` and ``--print-example-config`` come from the options' declarations
(``radix_global/options.py``). Each source overrides the one before: the defaults,
``--config FILE`` (YAML/TOML), the environment, the flags::

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
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from radix_global.options import OptionError, add_flags, env_values
from radix_global_cli import package_version
from router.config import (
    ENV_PREFIX,
    ConfigError,
    RouterConfig,
    example_config,
    load_config_file,
    options,
)

__all__ = ["ENV_PREFIX", "build_parser", "config_from_args", "main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + error
        raise ConfigError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="radix-global router", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"radix-global {package_version()}")
    p.add_argument("--config", help="YAML or TOML file with router options (flat names, at top "
                                    "level or under [router])")
    p.add_argument("--print-example-config", action="store_true",
                   help="print every option as an example TOML file and exit")
    # Every default is SUPPRESS: only flags given on the command line override file and env.
    add_flags(p, options(), ENV_PREFIX)
    return p


def config_from_args(argv: list[str], environ: Mapping[str, str] | None = None) -> RouterConfig:
    """defaults < ``--config`` file < ``environ`` (default: ``os.environ``) < flags."""
    args = vars(build_parser().parse_args(argv))
    args.pop("print_example_config", None)
    values: dict[str, Any] = {}
    path = args.pop("config", None)
    if path:
        values.update(load_config_file(path))
    try:
        values.update(env_values(options(), os.environ if environ is None else environ,
                                 ENV_PREFIX))
    except OptionError as exc:
        raise ConfigError(f"{exc} (environment)") from None
    values.update(args)
    return RouterConfig.from_options(**values)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if "--print-example-config" in argv:
            build_parser().parse_args(argv)  # the rest must still parse
            print(example_config(), end="")
            return 0
        config = config_from_args(argv)
    except ConfigError as exc:
        print(f"radix-global router: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, --version
        return int(exc.code or 0)
    logging.basicConfig(level=config.listen.log_level.upper(),
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
