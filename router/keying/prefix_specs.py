"""A shared prefix's definition as the platform gives it (``docs/interfaces.md`` section
"Shared platform prefixes across isolated tenants"): one entry of the tenants file's
``[shared_prefixes]`` table or one admin request, checked here before
:class:`router.keying.shared_prefixes.SharedPrefixes` registers it.

File::

    [shared_prefixes.support-agent]
    model = "tiny"
    text = "You are the support agent of ..."   # or token_ids = [...], or messages = [...]
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

MAX_PREFIX_TOKENS = 65536
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SOURCES = ("token_ids", "text", "messages")


class SharedPrefixError(ValueError):
    """A bad shared-prefix definition (HTTP 400, or a refused tenants file)."""


class SharedPrefixExists(SharedPrefixError):
    """A prefix of that name is registered already (HTTP 409)."""


class PrefixSpec(NamedTuple):
    """A registered prefix as the platform gave it: exactly one of the three sources."""

    name: str
    model: str
    token_ids: tuple[int, ...] | None = None
    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "model": self.model}
        if self.token_ids is not None:
            out["token_ids"] = list(self.token_ids)
        if self.text is not None:
            out["text"] = self.text
        if self.messages is not None:
            out["messages"] = list(self.messages)
        return out


def parse_spec(name: object, spec: object) -> PrefixSpec:
    """One definition from the tenants file or an admin request; :class:`SharedPrefixError`
    names what is wrong."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SharedPrefixError(f"shared prefix name {name!r} must be 1-64 characters of "
                                "A-Z a-z 0-9 . _ -")
    if not isinstance(spec, dict):
        raise SharedPrefixError(f"shared prefix {name!r} must be a table")
    unknown = set(spec) - {"name", "model", *_SOURCES}
    if unknown:
        raise SharedPrefixError(f"shared prefix {name!r}: unknown fields {sorted(unknown)}")
    if spec.get("name", name) != name:
        raise SharedPrefixError(f"shared prefix {name!r} says its name is {spec['name']!r}")
    model = spec.get("model")
    if not isinstance(model, str) or not model:
        raise SharedPrefixError(f"shared prefix {name!r} needs model = '<served model name>'")
    given = [s for s in _SOURCES if spec.get(s) is not None]
    if len(given) != 1:
        raise SharedPrefixError(f"shared prefix {name!r} needs exactly one of "
                                f"{', '.join(_SOURCES)}")
    ids, text, messages = spec.get("token_ids"), spec.get("text"), spec.get("messages")
    if ids is not None:
        if (not isinstance(ids, list) or not ids or len(ids) > MAX_PREFIX_TOKENS
                or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**63
                           for t in ids)):
            raise SharedPrefixError(f"shared prefix {name!r}: token_ids must be 1-"
                                    f"{MAX_PREFIX_TOKENS} non-negative integers")
        return PrefixSpec(name, model, token_ids=tuple(ids))
    if text is not None:
        if not isinstance(text, str) or not text:
            raise SharedPrefixError(f"shared prefix {name!r}: text must be a non-empty string")
        return PrefixSpec(name, model, text=text)
    if (not isinstance(messages, list) or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
        raise SharedPrefixError(f"shared prefix {name!r}: messages must be a non-empty list of "
                                "objects with a 'role'")
    return PrefixSpec(name, model, messages=tuple(messages))


def specs_from_mapping(table: object) -> list[PrefixSpec]:
    """The ``[shared_prefixes]`` table of a tenants file (absent: none)."""
    if table is None:
        return []
    if not isinstance(table, dict):
        raise SharedPrefixError("shared_prefixes must be a table of name -> {model, ...}")
    return [parse_spec(name, spec) for name, spec in table.items()]
