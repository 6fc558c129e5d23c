"""Options declared once (``docs/interfaces.md``, "Options: one config source per process"): the one
config source of every process.

A part of a process owns its options as a frozen dataclass, a *section*, whose fields carry
their help and bounds::

    @dataclass(frozen=True)
    class DispatchConfig:
        depth: Annotated[int, opt("gated requests per compute server", ge=1)] = 2

A process's config is a list of sections, each under a prefix that makes its options' flat
names (``dispatch_`` + ``depth`` = ``dispatch_depth``; ``opt(name=...)`` overrides it). From
that alone come the command-line flags (``--dispatch-depth``, plus ``aliases``), environment
variables (``<ENV PREFIX>DISPATCH_DEPTH``), ``--help`` (help, bounds, default, variable), the
example TOML and the checks: :func:`build` converts values from a file, the environment or flags
(text is read as the field's type) and refuses a bad one in one line naming the option and what
it must be (:class:`OptionError`). Nothing here reads the environment or ``sys.argv`` itself.

msgspec (already a dependency) does the conversion and the bounds: ``msgspec.convert`` checks a
dataclass's ``Annotated`` bounds and ``Literal`` choices and reads text as numbers in one call.
pydantic-settings would add two packages and an environment/CLI layer of its own, with its own
naming rules, that the three processes' existing flag names would have to be bent to.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import math
import re
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import msgspec

_NUMBER = (int, float)


class OptionError(ValueError):
    """A bad option value or name: one line, naming the option and its valid values."""


def opt(help: str, *, ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None, name: str | None = None,
        aliases: Sequence[str] = (), metavar: str | None = None) -> msgspec.Meta:
    """A field's metadata: its help, bounds, and (rarely) a flat name other than prefix +
    field, extra flag spellings (another tool's, or an old one) and a flag metavar."""
    extra: dict[str, Any] = {"aliases": tuple(aliases)}
    if name is not None:
        extra["name"] = name
    if metavar is not None:
        extra["metavar"] = metavar
    return _meta(ge=ge, gt=gt, le=le, lt=lt, description=help, extra=extra)


def _meta(**kw: Any) -> msgspec.Meta:
    # msgspec's stubs list the bound combinations one overload each
    return msgspec.Meta(**kw)


class Option(NamedTuple):
    """One option as the outside world names it."""

    name: str  # flat name: the flag without ``--`` and dashes, the TOML key, the env suffix
    section: str  # the process config's attribute that holds the section ("" : top level)
    field: str  # the section's field
    hint: Any  # its type, without Annotated
    default: Any
    help: str
    meta: msgspec.Meta | None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(self.meta.extra.get("aliases", ())) if self.meta and self.meta.extra else ()

    def bounds(self) -> str:
        """``>= 1``, ``in [0, 1)``, ``one of a, b``, or ``""``."""
        choices = literal_choices(self.hint)
        if choices:
            return "one of " + ", ".join(str(c) for c in choices)
        m = self.meta
        if m is None:
            return ""
        low = ("[", m.ge) if m.ge is not None else ("(", m.gt) if m.gt is not None else None
        high = ("]", m.le) if m.le is not None else (")", m.lt) if m.lt is not None else None
        if low and high:
            return f"in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
        if high:
            return f"{'<=' if high[0] == ']' else '<'} {high[1]:g}"
        return ""


class Section(NamedTuple):
    """Where a section sits in a process's config: ``attr`` of the config object (``""``: the
    config itself is this section), its dataclass, and the prefix of its options' names."""

    attr: str
    cls: type
    prefix: str = ""


def literal_choices(hint: Any) -> tuple[Any, ...]:
    """The choices of a ``Literal[...]`` or an ``Enum`` (its values) option; ``()`` else."""
    inner = optional_inner(hint)
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return tuple(m.value for m in inner)
    return typing.get_args(inner) if typing.get_origin(inner) is Literal else ()


def optional_inner(hint: Any) -> Any:
    """``X`` of ``X | None``; ``hint`` otherwise."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def section_options(section: Section) -> list[Option]:
    """The options of a section, in field order."""
    hints = typing.get_type_hints(section.cls, include_extras=True)
    out = []
    for f in dataclasses.fields(section.cls):
        hint, meta = hints[f.name], None
        if typing.get_origin(hint) is typing.Annotated:
            hint, *extras = typing.get_args(hint)
            meta = next((e for e in extras if isinstance(e, msgspec.Meta)), None)
        name = (meta.extra or {}).get("name") if meta is not None else None
        default = (f.default if f.default is not dataclasses.MISSING else
                   f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append(Option(name or section.prefix + f.name, section.attr, f.name, hint, default,
                          (meta.description or "") if meta is not None else "", meta))
    return out


def all_options(sections: Iterable[Section]) -> list[Option]:
    """Every option of a process; :class:`ValueError` if two share a name (a declaration
    bug, caught by the tests)."""
    out: list[Option] = []
    seen: set[str] = set()
    for section in sections:
        for o in section_options(section):
            names = {o.name, *(a.lstrip("-").replace("-", "_") for a in o.aliases)}
            clash = names & seen
            if clash:
                raise ValueError(f"option name {sorted(clash)[0]!r} declared twice")
            seen |= names
            out.append(o)
    return out


def describe(hint: Any) -> str:
    """``an integer``, ``a number``, ``a list of text``... for messages."""
    inner = optional_inner(hint)
    origin = typing.get_origin(inner)
    choices = literal_choices(hint)
    base = ("one of " + ", ".join(map(str, choices)) if choices else
            "a list" if origin in (tuple, list) else "a table" if origin in (dict, Mapping) else
            {bool: "true or false", int: "an integer", float: "a number", str: "text"}.get(
                inner, getattr(inner, "__name__", str(inner))))
    return base + (" or unset" if inner is not hint else "")


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def from_text(option: Option, text: str) -> Any:
    """An option's value written as text (an environment variable, a ``KEY=VALUE`` item):
    lists split on spaces or commas, switches ``1/0 true/false yes/no on/off``, an empty
    optional value unset; the rest is converted and checked by :func:`build`."""
    inner = optional_inner(option.hint)
    origin = typing.get_origin(inner)
    if inner is not option.hint and text.strip() == "":
        return None
    if origin in (tuple, list):
        return [t for t in re.split(r"[\s,]+", text.strip()) if t]
    if inner is bool:
        word = text.strip().lower()
        if word not in _TRUE | _FALSE:
            raise OptionError(f"{option.name} must be one of 1/0, true/false, yes/no, on/off, "
                              f"got {text!r}")
        return word in _TRUE
    return text


def build(section: Section, values: Mapping[str, Any]) -> Any:
    """The section's dataclass from flat-named ``values`` (its own options only; absent ones
    take their defaults); :class:`OptionError` naming the first bad value, or the section's own
    refusal (its ``__post_init__``: a rule between options) in one line."""
    kwargs = {o.field: convert(o, values[o.name]) for o in section_options(section)
              if o.name in values}
    try:
        return section.cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise OptionError(str(exc).splitlines()[0]) from None


def convert(o: Option, value: Any) -> Any:
    """``value`` as option ``o``'s type (text read as a number where one is wanted), within its
    bounds; :class:`OptionError` naming the option and what it must be."""
    inner = optional_inner(o.hint)
    if value is None and inner is not o.hint:
        return None
    origin = typing.get_origin(inner)
    if origin in (tuple, list) and isinstance(value, str):
        value = from_text(o, value)  # a file's ``workers = "URL"``
    if origin in (dict, Mapping) and isinstance(value, str | list | tuple):
        value = _items_table(o, value)  # flags' / the environment's KEY=VALUE items
    choices = literal_choices(o.hint)
    if isinstance(value, str) and choices and value not in choices:
        folded = [c for c in choices if isinstance(c, str) and c.lower() == value.lower()]
        value = folded[0] if len(folded) == 1 else value  # choices in any case
    if inner in _NUMBER:
        if isinstance(value, str):
            value = _number(o, value)
        if isinstance(value, float) and not math.isfinite(value):
            raise OptionError(f"{o.name} must be a finite number, got {value!r}")
    target: Any = inner
    if o.meta is not None and inner in _NUMBER and o.bounds():
        m = o.meta
        target = Annotated[inner, _meta(ge=m.ge, gt=m.gt, le=m.le, lt=m.lt)]
    try:
        return msgspec.convert(value, target, strict=False)
    except msgspec.ValidationError:
        bounds = o.bounds()
        want = describe(o.hint) + (f" {bounds}" if bounds and not literal_choices(o.hint)
                                   else "")
        raise OptionError(f"{o.name} must be {want}, got {value!r}") from None


def _items_table(o: Option, items: str | Sequence[Any]) -> dict[str, Any]:
    """``KEY=VALUE`` items (a list, or text split on spaces) as a table; for a table of any
    values (``dict[str, Any]``) a value is read as a TOML value (number, true/false,
    \"text\") where it is one, else kept as text."""
    args = typing.get_args(optional_inner(o.hint))
    scalars = len(args) == 2 and args[1] is Any
    out: dict[str, Any] = {}
    for item in items.split() if isinstance(items, str) else items:
        key, sep, value = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not sep or not key:
            metavar = (o.meta.extra or {}).get("metavar") if o.meta is not None else None
            raise OptionError(f"{o.name}: {item!r} is not {metavar or 'KEY=VALUE'}")
        out[key] = _toml_scalar(value) if scalars else value
    return out


def _toml_scalar(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _number(o: Option, text: str) -> Any:
    kind = optional_inner(o.hint)
    try:
        return int(text.strip()) if kind is int else float(text)
    except ValueError:
        raise OptionError(f"{o.name} must be {describe(o.hint)}, got {text!r}") from None


def check_names(options: Sequence[Option], values: Mapping[str, Any], what: str
                ) -> dict[str, Any]:
    """``values`` with ``-`` read as ``_`` and aliases as their option's name;
    :class:`OptionError` naming an unknown one."""
    names = {o.name: o.name for o in options}
    names.update({a.lstrip("-").replace("-", "_"): o.name for o in options for a in o.aliases})
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = names.get(key.replace("-", "_"))
        if name is None:
            raise OptionError(f"unknown {what} option {key!r}")
        out[name] = value
    return out


def flag_help(option: Option, env_prefix: str | None) -> str:
    parts = [option.help]
    bounds = option.bounds()
    if bounds:
        parts.append(bounds)
    if option.default not in (None, (), {}, ""):
        parts.append(f"default {option.default}")
    if env_prefix is not None:
        parts.append(f"env {env_prefix}{option.name.upper()}")
    return "; ".join(parts)


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
              options: Iterable[Option], env_prefix: str | None) -> None:
    """One flag per option (its name and aliases), every default SUPPRESS: only what the
    command line gives overrides the file and the environment."""
    for o in options:
        inner = optional_inner(o.hint)
        kw: dict[str, Any] = {"dest": o.name, "default": argparse.SUPPRESS,
                              "help": flag_help(o, env_prefix)}
        metavar = (o.meta.extra or {}).get("metavar") if o.meta is not None else None
        if inner is bool:
            parser.add_argument(o.flag, *o.aliases, action=argparse.BooleanOptionalAction, **kw)
        elif typing.get_origin(inner) in (tuple, list, dict):
            parser.add_argument(o.flag, *o.aliases, nargs="+", metavar=metavar or "ITEM", **kw)
        else:
            choices = literal_choices(o.hint)
            parser.add_argument(o.flag, *o.aliases, metavar=metavar or (
                "{" + ",".join(map(str, choices)) + "}" if choices else
                {int: "N", float: "X"}.get(inner, "TEXT")), **kw)


def env_values(options: Iterable[Option], environ: Mapping[str, str], env_prefix: str
               ) -> dict[str, Any]:
    """The options set as ``<env_prefix><NAME>`` in ``environ``, read from text."""
    return {o.name: from_text(o, environ[key]) for o in options
            if (key := env_prefix + o.name.upper()) in environ}


def example_toml(title: str, sections: Sequence[Section], skip: Iterable[str] = ()) -> str:
    """Every option with its help, bounds and default, one TOML key each (``skip``: secrets and
    machine-specific values, written commented out)."""
    hidden = set(skip)
    lines = [f"# {title}", "# Generated from the options' declarations: every option, its "
             "default, its bounds.", ""]
    for section in sections:
        doc = (section.cls.__doc__ or "").strip().splitlines()
        if doc:
            lines.append(f"# -- {doc[0]}")
        for o in section_options(section):
            bounds = o.bounds()
            lines.append(f"# {o.help}" + (f" ({bounds})" if bounds else ""))
            value = _toml_value(o.default)
            lines.append(f"{'# ' if value is None or o.name in hidden else ''}{o.name} = "
                         f"{value if value is not None else '...'}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        parts = [_toml_value(v) for v in value]
        return "[" + ", ".join(p for p in parts if p is not None) + "]"
    if isinstance(value, dict):
        items = [f"{k} = {_toml_value(v)}" for k, v in value.items()]
        return "{" + ", ".join(items) + "}"
    return None


def load_config_file(path: str | Path, table: str, opts: Sequence[Option], what: str
                     ) -> dict[str, Any]:
    """The option values of a TOML (``.toml``) or YAML (``.yaml``/``.yml``) file: flat keys, or
    under a ``table`` table; :class:`OptionError` for an unreadable file or an unknown key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise OptionError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise OptionError(f"config file must end in .toml, .yaml or .yml: {path}")
    except OptionError:
        raise
    except Exception as exc:  # yaml.YAMLError, tomllib.TOMLDecodeError
        raise OptionError(f"cannot parse {path}: {exc}".splitlines()[0]) from None
    if not isinstance(data, Mapping):
        raise OptionError(f"{path}: top level must be a mapping")
    if isinstance(data.get(table), Mapping):
        data = data[table]
    return check_names(opts, {str(k): v for k, v in data.items()}, what)


def declaration_problems(options: Iterable[Option], unbounded: Iterable[str] = ()) -> list[str]:
    """What is wrong with a process's declarations (its tests assert none): an option without
    help, a number without bounds (``unbounded``: names that may take any value, each for a
    reason its caller states)."""
    free = set(unbounded)
    bad = []
    for o in options:
        if not o.help.strip():
            bad.append(f"{o.name}: no help")
        if optional_inner(o.hint) in _NUMBER and not o.bounds() and o.name not in free:
            bad.append(f"{o.name}: a number without bounds")
    return bad
