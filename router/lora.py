"""LoRA requests: which adapter a request names, and the extra key its pages are keyed with.

Contract (``docs/interfaces.md`` section 3): SGLang takes the adapter from an OpenAI ``model`` of
the form ``<served model>:<adapter>`` (it wins) or from ``lora_path``. The router routes such a
request in the served model's pool, forwards it unchanged, and keys its pages in the adapter's
namespace: SGLang's own extra key when the adapter's path is configured (``lora_paths``), else
a namespace of the router's own, so a LoRA request never matches base-model pages.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from radix_global.keys import lora_extra_key

ROUTER_LORA_PREFIX = "radix-global-lora:"


class ModelRef(NamedTuple):
    model: str  # the served model whose pool routes the request
    adapter: str | None  # from ``<model>:<adapter>``


def resolve_model(requested: str, served: Collection[str]) -> ModelRef | None:
    """The served model (and adapter) ``requested`` names; None if it names none. An exact served
    name wins (names may contain colons); else the longest served name followed by ``:``."""
    if requested in served:
        return ModelRef(requested, None)
    best = max((m for m in served if requested.startswith(m + ":")), key=len, default=None)
    if best is None:
        return None
    adapter = requested[len(best) + 1 :].strip()
    return ModelRef(best, adapter or None)


def request_adapter(payload: Mapping[str, Any], from_model: str | None) -> str | None:
    """The adapter of the request's (first) prompt: the model's suffix, else ``lora_path``."""
    if from_model is not None:
        return from_model
    value = payload.get("lora_path")
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, str) and value else None


def adapter_extra_key(adapter: str | None, lora_paths: Mapping[str, str]) -> str | None:
    """The extra key the adapter's pages are keyed with; None for the base model."""
    if adapter is None:
        return None
    path = lora_paths.get(adapter)
    return lora_extra_key(adapter, path) if path is not None else ROUTER_LORA_PREFIX + adapter


def parse_lora_paths(items: Any) -> dict[str, str]:
    """``{name: path}`` from a mapping or from SGLang-style ``name=path`` strings; ValueError
    names the bad entry."""
    if isinstance(items, Mapping):
        pairs = list(items.items())
    elif isinstance(items, list | tuple):
        pairs = []
        for item in items:
            name, sep, path = item.partition("=") if isinstance(item, str) else ("", "", "")
            if not sep:
                raise ValueError(f"lora_paths entry {item!r} is not NAME=PATH")
            pairs.append((name, path))
    else:
        raise ValueError("lora_paths must map adapter names to paths")
    out: dict[str, str] = {}
    for name, path in pairs:
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            raise ValueError(f"lora_paths entry {name!r} = {path!r}: name and path must be "
                             "non-empty strings")
        out[name] = path
    return out
