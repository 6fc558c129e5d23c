"""LoRA requests: which adapter a request names, and the extra key its pages are keyed with.

Contract (``docs/interfaces.md`` section "Page keys"): SGLang takes the adapter from an OpenAI
``model`` of the form ``<served model>:<adapter>`` (it wins) or from ``lora_path``. The router
routes such a request in the served model's pool, forwards it unchanged, and keys its pages in the
adapter's namespace: SGLang's own extra key when the worker reports the adapter (``/server_info``
``lora_paths``) or the operator configured its path (``lora_paths``), else a namespace of the
router's own, so a LoRA request never matches base-model pages.
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


def adapter_extra_key(adapter: str | None, *known: Mapping[str, str]) -> str | None:
    """The extra key the adapter's pages are keyed with (``known``: adapter name -> SGLang extra
    key maps, the first that has it wins); None for the base model, the router's own namespace
    for an adapter none knows."""
    if adapter is None:
        return None
    for names in known:
        key = names.get(adapter)
        if key is not None:
            return key
    return ROUTER_LORA_PREFIX + adapter


def configured_extra_keys(lora_paths: Mapping[str, str]) -> dict[str, str]:
    """SGLang's extra key of each ``name -> path`` adapter (``--lora-paths name=path``)."""
    return {name: lora_extra_key(name, path) for name, path in lora_paths.items()}


def adapters_from_server_info(server: Mapping[str, Any]) -> dict[str, str]:
    """Adapter name -> SGLang extra key from an SGLang ``/server_info``: its ``lora_paths`` are
    ``{"lora_name", "lora_path", "lora_id"}`` records (SGLang 0.5.23; the ``lora_id`` is the
    extra key) or ``name=path`` strings. Entries of other shapes are skipped."""
    items = server.get("lora_paths")
    if isinstance(items, Mapping):
        items = [f"{k}={v}" for k, v in items.items()]
    out: dict[str, str] = {}
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping):
            name, lora_id, path = item.get("lora_name"), item.get("lora_id"), item.get("lora_path")
            if isinstance(name, str) and isinstance(lora_id, str) and lora_id:
                out[name] = lora_id
            elif isinstance(name, str) and isinstance(path, str):
                out[name] = lora_extra_key(name, path)
        elif isinstance(item, str) and "=" in item:
            name, _, path = item.partition("=")
            out[name] = lora_extra_key(name, path)
    return out


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
