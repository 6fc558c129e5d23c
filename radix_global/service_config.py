"""The index service's options (``docs/interfaces.md``, "Options: one config source per process"),
declared once: ServiceConfig.

From it come ``radix-global index serve``'s flags (``--heartbeat-timeout-s``), environment
variables (``RADIX_GLOBAL_INDEX_<NAME>``; the admin token also ``RADIX_GLOBAL_ADMIN_TOKEN``),
``--help``, ``--print-example-config`` (``docs/examples/index.toml``) and the checks. Sources,
each overriding the one before: defaults, ``--config FILE`` (TOML or YAML; flat keys, or under
an ``[index]`` table), the environment, the flags.

The old spellings of flags (``--heartbeat-timeout``, ``--snapshot-interval``) are the options'
``aliases``: still accepted, with a one-line deprecation warning naming the new flag
(:func:`add_option_flags`, which the launch wrapper uses too).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from radix_global.options import (
    Option,
    Section,
    add_flags,
    all_options,
    build,
    env_values,
    example_toml,
    load_config_file,
    opt,
)

PROG = "radix-global index"
ENV_PREFIX = "RADIX_GLOBAL_INDEX_"
TOKEN_ENV = "RADIX_GLOBAL_ADMIN_TOKEN"  # the admin token's variable in all three processes
DEFAULT_PORT = 50051
LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True)
class ServiceConfig:
    """The index service (radix-global index serve)."""

    host: Annotated[str, opt("address the gRPC server listens on", metavar="ADDR")] = "127.0.0.1"
    port: Annotated[int, opt("gRPC port (0: any free port)", ge=0, le=65535)] = 0
    snapshot_path: Annotated[str | None, opt(
        "snapshot file: restored on start, written on stop (and on Snapshot calls)",
        name="snapshot", metavar="PATH")] = None
    snapshot_interval_s: Annotated[float, opt(
        "also snapshot every this many seconds (0: only on a Snapshot call and at shutdown)",
        ge=0, aliases=("--snapshot-interval",))] = 0.0
    start_empty_on_bad_snapshot: Annotated[bool, opt(
        "warn and start empty when the snapshot cannot be read (default: refuse to start)")
    ] = False
    admin_token: Annotated[str | None, opt(
        "token for admin calls and the key queries Match/HotPrefixes (unset: those only from "
        f"loopback); also env {TOKEN_ENV}", metavar="TOKEN")] = None
    shards: Annotated[int, opt("index partitions, by a chain's first page key", ge=1)] = 1
    heartbeat_timeout_s: Annotated[float, opt(
        "a worker silent this long is removed", gt=0, aliases=("--heartbeat-timeout",))] = 20.0
    half_life_s: Annotated[float | None, opt(
        "half-life of a prefix's hotness (unset: the index's default)", gt=0)] = None
    log_level: Annotated[LogLevel, opt("log level (any case)")] = "info"
    conductor_port: Annotated[int | None, opt(
        "also serve Mooncake Conductor's indexer HTTP API (/register, /query) on --host:PORT "
        "(0: any free port; unset: off; docs/interfaces.md, \"Mooncake Conductor's indexer API\")",
        ge=0, le=65535, metavar="PORT")] = None
    metrics_port: Annotated[int | None, opt(
        "also serve Prometheus /metrics (the index's size, refusals, KV event feeds) on "
        "--host:PORT (0: any free port; unset: off)", ge=0, le=65535, metavar="PORT")] = None


@dataclass(frozen=True)
class ServeConfig(ServiceConfig):
    """The index service (radix-global index serve)."""

    # The command's well-known port; an in-process IndexServer (tests) binds any free one.
    port: Annotated[int, opt("gRPC port (0: any free port)", ge=0, le=65535)] = DEFAULT_PORT


SECTIONS = [Section("", ServeConfig)]


def options() -> list[Option]:
    return all_options(SECTIONS)


def example_config() -> str:
    """``docs/examples/index.toml``: every option with its help, bounds and default."""
    return example_toml("radix-global index serve --config index.toml (or the same keys under "
                        "[index])", SECTIONS, skip=("admin_token",))


class _DeprecatedSpelling(argparse.Action):
    """An old spelling of a flag: stores like the new one, and says which that is."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "",
                 prog: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.prog = new, prog

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{self.prog}: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def without_aliases(o: Option) -> Option:
    """``o`` without its extra spellings (they are added as deprecated ones)."""
    m = o.meta
    if m is None or not o.aliases:
        return o
    kw = {k: getattr(m, k) for k in ("ge", "gt", "le", "lt", "description")
          if getattr(m, k) is not None}
    meta: Any = msgspec.Meta
    return o._replace(meta=meta(**kw, extra={k: v for k, v in (m.extra or {}).items()
                                             if k != "aliases"}))


def add_option_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                     opts: Iterable[Option], env_prefix: str | None, prog: str,
                     taken: Iterable[str] = ()) -> list[str]:
    """:func:`radix_global.options.add_flags`, each alias added as a deprecated spelling (hidden
    from ``--help``; using it prints one line naming the new flag). An alias in ``taken`` (a flag
    another parser defines, whose meaning wins) is left out; the left-out ones are returned."""
    taken, left_out = set(taken), []
    for o in opts:
        add_flags(parser, [without_aliases(o)], env_prefix)
        for alias in o.aliases:
            if alias in taken:
                left_out.append(alias)
                continue
            switch = o.hint is bool
            parser.add_argument(alias, action=_DeprecatedSpelling, dest=o.name,
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                                nargs=0 if switch else None, new=o.flag, prog=prog)
    return left_out



def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """``index serve``'s arguments: ``--config``, ``--print-example-config`` and one flag per
    option (a new subcommand's flags go on its own parser beside it)."""
    serve.add_argument("--config", metavar="FILE",
                       help="TOML or YAML file of these options (flat, or under [index])")
    serve.add_argument("--print-example-config", action="store_true",
                       help="print an example config file (every option, its default) and exit")
    add_option_flags(serve.add_argument_group("index service options"), options(), ENV_PREFIX,
                     PROG)


def config_from(args: Mapping[str, Any], environ: Mapping[str, str]) -> ServeConfig:
    """defaults < ``--config`` file < environment < flags (``args``: the parsed flags, only
    those given); :class:`OptionError` naming the first bad value."""
    opts = options()
    flags = {k: v for k, v in args.items() if k not in ("command", "config",
                                                         "print_example_config")}
    values: dict[str, Any] = {}
    if args.get("config"):
        values.update(load_config_file(args["config"], "index", opts, "index"))
    if environ.get(TOKEN_ENV):
        values["admin_token"] = environ[TOKEN_ENV]
    values.update(env_values(opts, environ, ENV_PREFIX))
    values.update(flags)
    if isinstance(values.get("log_level"), str):
        values["log_level"] = values["log_level"].lower()
    if values.get("admin_token") == "":
        values["admin_token"] = None
    config: ServeConfig = build(SECTIONS[0], values)
    return config
