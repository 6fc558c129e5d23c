"""A policy's options checked against its constructor, so that a misspelt or mistyped option
stops the router at start, naming the valid ones, instead of surfacing as a ``TypeError`` (or not
at all) on the first request.

Only policy options (``policy_options``) are checked here: they are keyed by each policy's
constructor signature, not declared as a section, so :func:`coerce` reads the constructor's type
hints. Every router option is declared and converted by ``radix_global/options.py``
(``router/config.py``). Pure.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any

from router.routing.contract import PolicyConfigError

# Constructor parameters that are not user options: the router passes them itself.
INTERNAL = frozenset({"self", "slo"})


def describe(hint: Any) -> str:
    """``int``, ``float or None``, ``list of str``, ... for error messages."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("None" if a is type(None) else describe(a) for a in args)
    if origin is tuple:
        return f"list of {describe(args[0])}"
    if origin in (dict, Mapping):
        return f"table of {describe(args[1])}" if args else "table"
    if hint is Any:
        return "any value"
    return getattr(hint, "__name__", str(hint))


def coerce(name: str, value: Any, hint: Any) -> Any:
    """``value`` as type ``hint`` wants it (an int where a float is wanted becomes a float, a
    list where a tuple is wanted a tuple); ``ValueError`` naming ``name`` when it does not fit.
    Understands ``bool``, ``int``, ``float``, ``str``, ``X | None``, ``tuple[X, ...]``,
    ``dict[str, X]`` and ``Any``."""
    ok, out = _fit(value, hint)
    if not ok:
        raise ValueError(f"{name} must be {describe(hint)}, got {value!r}")
    return out


def _fit(value: Any, hint: Any) -> tuple[bool, Any]:
    if hint is Any:
        return True, value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return type(None) in args, None
        for arg in args:
            if arg is not type(None):
                ok, out = _fit(value, arg)
                if ok:
                    return True, out
        return False, value
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            return False, value
        fitted = [_fit(v, args[0]) for v in value]
        return all(ok for ok, _ in fitted), tuple(v for _, v in fitted)
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            return False, value
        table = {k: _fit(v, args[1] if args else Any) for k, v in value.items()}
        return all(ok for ok, _ in table.values()), {k: v for k, (_, v) in table.items()}
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if isinstance(hint, type):
        return isinstance(value, hint), value
    return True, value  # a hint this checker does not model: the constructor checks it


def option_hints(cls: type) -> dict[str, Any]:
    """The user options of policy class ``cls``: its constructor's keyword parameters (minus
    :data:`INTERNAL`) and their type hints."""
    hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    params = inspect.signature(cls).parameters  # without self
    return {n: hints.get(n, Any) for n, p in params.items()
            if n not in INTERNAL and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_options(policy: str, cls: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` checked (names, types) against ``cls``'s constructor; the coerced values.
    :class:`PolicyConfigError` names the policy, the option and the valid options."""
    hints = option_hints(cls)
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name not in hints:
            valid = ", ".join(hints) or "none"
            raise PolicyConfigError(f"bad option for policy {policy!r}: no option {name!r}; "
                                    f"valid options: {valid}")
        try:
            out[name] = coerce(f"policy {policy!r} option {name}", value, hints[name])
        except ValueError as exc:
            raise PolicyConfigError(str(exc)) from exc
    return out
