"""The command line of ``radix-global sglang``: our flags, declared once, and SGLang's, read by
SGLang's own parser (``docs/interfaces.md``, "Options: one config source per process").

Ours are :class:`OurFlags`, a section of :mod:`radix_global.options`: ``--radix-global URL`` and
every other one ``--radix-global-<name>``, in an argument group of their own; environment
variables ``RADIX_GLOBAL_WORKER_<NAME>`` (the admin token also ``RADIX_GLOBAL_ADMIN_TOKEN``);
sources defaults < environment < flags. The old unprefixed spellings (``--pool``, ``--role``,
``--heartbeat-interval`` ...) are still accepted with a one-line deprecation warning, but only
while SGLang does not define that flag itself: then it is SGLang's.

Everything else is SGLang's and is parsed by ``ServerArgs.add_cli_args``'s parser, as
``sglang.launch_server`` parses it: an unknown or misspelt flag, or a bad value, is SGLang's own
one-line message before anything starts. SGLang's argv is passed on as the user wrote it.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from radix_global.options import (
    Option,
    OptionError,
    Section,
    all_options,
    build,
    env_values,
    opt,
)
from radix_global.registration import check_place
from radix_global.service_config import TOKEN_ENV, add_option_flags

PROG = "radix-global sglang"
FLAG_PREFIX = "--radix-global"
ENV_PREFIX = "RADIX_GLOBAL_WORKER_"
URL = "url"  # the flat name of --radix-global itself


class LaunchError(ValueError):
    """An impossible or contradictory combination of flags, explained."""


@dataclass(frozen=True)
class OurFlags:
    """radix-global's flags of radix-global sglang (every other flag is SGLang's)."""

    radix_global: Annotated[str | None, opt(
        "router (or index) URL to register with; several routers sharing one view "
        "comma-separated, the worker fails over between them (omit: a standalone worker with "
        "the pool only)",
        name=URL, metavar="URL")] = None
    advertise_host: Annotated[str | None, opt(
        "address other hosts reach this worker at: the event endpoints bind it and the "
        "registration names it (default: SGLang's --host, unless it is a wildcard such as "
        "0.0.0.0, which then needs this flag)", metavar="ADDR",
        aliases=("--advertise-host",))] = None
    event_port_base: Annotated[int | None, opt(
        "fixed ports for a firewall: KV events on PORT (+ dp rank), replay on PORT + dp size, "
        "pool events on PORT + 2 x dp size (default: free ports of 30100-32767)", ge=1,
        le=65535, metavar="PORT", aliases=("--event-port-base",))] = None
    worker_id: Annotated[str | None, opt(
        "the registered worker id (default sgl-<advertise host>-<port>)", metavar="ID",
        aliases=("--worker-id",))] = None
    admin_token: Annotated[str | None, opt(
        f"the router's/index's admin token (also env {TOKEN_ENV})", metavar="TOKEN",
        aliases=("--admin-token",))] = None
    role: Annotated[Literal["mixed", "prefill", "decode"] | None, opt(
        "registered role; must agree with SGLang's --disaggregation-mode if that is given; "
        "without it, prefill/decode is a pool hand-off worker (docs/pd.md)",
        aliases=("--role",))] = None
    namespace: Annotated[str | None, opt(
        "the KV namespace (default <served model>@<config.json hash>)", metavar="NS",
        aliases=("--namespace",))] = None
    pool: Annotated[str, opt(
        "the L3 pool: this machine's shared memory, or a Mooncake Store shared by every host "
        "(this worker contributes --radix-global-pool-capacity-gb of memory as a segment)",
        metavar="shm|mooncake://MASTER:PORT", aliases=("--pool",))] = "shm"
    pool_id: Annotated[str | None, opt(
        "L3 pool id (default shm-<hostname>; for Mooncake this worker's segment "
        "mooncake-<master>-<port>@<advertised host>:<port>)", metavar="ID",
        aliases=("--pool-id",))] = None
    pool_capacity_gb: Annotated[float, opt(
        "pool size in GB (the first process to open it decides)", gt=0,
        aliases=("--pool-capacity-gb",))] = 1.0
    pool_root: Annotated[str | None, opt(
        "the shm pool's folder (default /dev/shm/radix-global)", metavar="DIR",
        aliases=("--pool-root",))] = None
    pool_disk: Annotated[str | None, opt(
        "a folder: the pool's persistent tier, every page written through to it "
        "(docs/interfaces.md, \"The persistent disk tier under the pool\")", metavar="DIR",
        aliases=("--pool-disk",))] = None
    pool_disk_gb: Annotated[float, opt(
        "the persistent tier's size in GB", gt=0, aliases=("--pool-disk-gb",))] = 10.0
    # Off by default: seconds of start-up and 512 tokens of pool room (interfaces.md,
    # "Worker registration")
    pool_load_probe_tokens: Annotated[int, opt(
        "prompt length of the start-up probe of the engine's load path from the pool (512 is "
        "a good length; 0: off)", ge=0, aliases=("--pool-load-probe-tokens",))] = 0
    place: Annotated[str | None, opt(
        "the fault domains this host sits in, widest first (zone-a/rack-3): the router prices "
        "fetches on the path between hosts (docs/interfaces.md, \"Where hosts are\")",
        metavar="DOMAINS")] = None
    heartbeat_interval_s: Annotated[float, opt(
        "seconds between heartbeats to the router", gt=0,
        aliases=("--heartbeat-interval",))] = 5.0

    def __post_init__(self) -> None:
        if self.place is not None:  # refused before the engine starts, not at registration
            check_place(self.place)


class WrapperOption(Option):
    """An option of :class:`OurFlags`: ``--radix-global-<name>`` (``--radix-global`` itself for
    the URL), its environment variable ``RADIX_GLOBAL_WORKER_<NAME>``."""

    __slots__ = ()

    @property
    def flag(self) -> str:
        return FLAG_PREFIX if self.name == URL else f"{FLAG_PREFIX}-{self.name.replace('_', '-')}"


SECTION = Section("", OurFlags)


def our_options() -> list[WrapperOption]:
    return [WrapperOption(*o) for o in all_options([SECTION])]


def flag_of(name: str) -> str:
    return next(o.flag for o in our_options() if o.name == name)


class _Refusing(argparse.ArgumentParser):
    """A parser whose error is a :class:`LaunchError` (one line), never an exit."""

    def error(self, message: str) -> Any:  # argparse's own message, e.g. unrecognized arguments
        if message.startswith("unrecognized arguments"):
            message += " (neither SGLang's nor radix-global's; radix-global sglang --help)"
        raise LaunchError(message)


@dataclass(frozen=True)
class SglangParser:
    """SGLang's parser, as ``sglang.launch_server`` builds it, its defaults, and its flags.
    Parsed with every default suppressed: what the user gave is known apart from a default."""

    parser: argparse.ArgumentParser
    defaults: Mapping[str, Any]
    flags: frozenset[str]


@functools.cache
def sglang_parser() -> SglangParser:
    """SGLang's parser (``ServerArgs.add_cli_args``); a :class:`LaunchError` when SGLang is not
    importable."""
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError as exc:
        raise LaunchError(f"cannot import SGLang's server arguments: {exc}") from exc
    parser = _Refusing(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    defaults = {a.dest: a.default for a in parser._actions}
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    flags = frozenset(s for a in parser._actions for s in a.option_strings)
    return SglangParser(parser, defaults, flags)


@dataclass(frozen=True)
class SglangArgs:
    """SGLang's arguments: ``argv`` as the user wrote it, the values it sets (by ``dest``, e.g.
    ``model_path``) and SGLang's defaults for the rest."""

    argv: tuple[str, ...]
    given: Mapping[str, Any]
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, dest: str) -> Any:
        return self.given[dest] if dest in self.given else self.defaults.get(dest)

    def has(self, dest: str) -> bool:
        """Whether the user set it (any spelling, ``--x V`` or ``--x=V``)."""
        return dest in self.given


def parse_sglang(argv: Sequence[str]) -> SglangArgs:
    """SGLang's arguments by SGLang's parser: :class:`LaunchError` with its message for an
    unknown flag or a bad value. A ``--config FILE`` of SGLang's is merged as SGLang merges it
    (for reading only: the argv stays as written)."""
    sg = sglang_parser()
    args = list(argv)
    given = vars(sg.parser.parse_args(args))
    if given.get("config"):
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        try:
            merged = ConfigArgumentMerger(sg.parser).merge_config_with_args(args)
        except (OSError, ValueError) as exc:
            raise LaunchError(f"--config {given['config']}: {exc}") from exc
        given = vars(sg.parser.parse_args(merged))
    return SglangArgs(tuple(args), given, sg.defaults)


def our_parser(taken: Iterable[str] = ()) -> argparse.ArgumentParser:
    """Our flags alone, in their group (``taken``: SGLang's flags, whose old spellings of ours
    are then left to SGLang)."""
    p = _Refusing(prog=PROG, add_help=False, allow_abbrev=False)
    group = p.add_argument_group("radix-global", "this worker's part in the cluster; every "
                                 "other flag is SGLang's (python -m sglang.launch_server --help)")
    add_option_flags(group, our_options(), ENV_PREFIX, PROG, taken=taken)
    return p


def clashes(taken: Iterable[str]) -> tuple[list[str], list[str]]:
    """Our flags that are also in ``taken`` (SGLang's: a declaration bug), and our old
    spellings that are (SGLang's meaning wins for those)."""
    taken = set(taken)
    opts = our_options()
    return ([o.flag for o in opts if o.flag in taken],
            [a for o in opts for a in o.aliases if a in taken])


def help_text() -> str:
    """``radix-global sglang --help``: our group, then where SGLang's flags are."""
    return (our_parser().format_help().replace("usage: radix-global sglang",
                                               "usage: radix-global sglang [SGLang flags]", 1)
            + "\nEvery other flag goes to sglang.launch_server (see its --help).\n")


@dataclass(frozen=True)
class LaunchArgs:
    flags: OurFlags
    sglang: SglangArgs


def parse_argv(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> LaunchArgs:
    """Split ``argv`` into ours (with the environment: ``environ``, default ``os.environ``) and
    SGLang's, each read by its own parser; :class:`LaunchError` for any bad one."""
    environ = os.environ if environ is None else environ
    sg = sglang_parser()
    bad, _ = clashes(sg.flags)
    if bad:  # caught by the tests; never reaches a user
        raise LaunchError(f"radix-global's flags {bad} are also SGLang's")
    ours, rest = our_parser(sg.flags).parse_known_args(list(argv))
    opts = our_options()
    values: dict[str, Any] = {}
    if environ.get(TOKEN_ENV):
        values["admin_token"] = environ[TOKEN_ENV]
    try:
        values.update(env_values(opts, environ, ENV_PREFIX))
        values.update(vars(ours))
        if values.get("admin_token") == "":
            values["admin_token"] = None
        flags: OurFlags = build(SECTION, values)
    except OptionError as exc:
        raise LaunchError(_as_flag(str(exc), opts)) from None
    return LaunchArgs(flags, parse_sglang(rest))


def _as_flag(message: str, opts: Sequence[Option]) -> str:
    """An :class:`OptionError` naming the flag (``--radix-global-pool-disk-gb must be ...``)."""
    for o in sorted(opts, key=lambda o: -len(o.name)):
        if message.startswith(o.name + " "):
            return o.flag + message[len(o.name):]
    return message
