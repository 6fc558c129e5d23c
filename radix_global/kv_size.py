"""How many bytes one token's KV cache occupies: what a pool fetch of it moves on the wire.

One rule, :func:`for_worker`, for both ways a worker tells the router (``docs/interfaces.md``,
"Worker registration", field ``kv_bytes_per_token``): the launch wrapper registering a worker
(``sglang_patch/register.py``) and the router describing a command-line worker
(``router/cluster/discovery.py``). The model folder's ``config.json`` is exact
(:func:`from_model_config`); where it cannot be read (the router's host may not have it) the
engine's ``/server_info`` account of its KV pool is (:func:`from_server_info`). The router prices
a namespace's pool fetches with it (``router/routing/cost.py``); without it every model would be
priced as LLaMA3-70B.

Every function returns ``None`` when its input does not say (never a guess), and counts every
tensor/pipeline-parallel rank: each rank fetches its own shard of a page from the pool. Pure,
apart from reading ``config.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1,
    "fp4_e2m1": 1,  # packed two per byte, plus scales: a byte is the honest upper bound
}


def dtype_bytes(*names: Any) -> int | None:
    """Bytes per element of the first of ``names`` that names a dtype (``"auto"``, ``None`` and
    unknown names are skipped): e.g. ``dtype_bytes(kv_cache_dtype, dtype, torch_dtype)``."""
    for name in names:
        if isinstance(name, str):
            size = _DTYPE_BYTES.get(name.removeprefix("torch.").lower())
            if size is not None:
                return size
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def from_model_config(config: Mapping[str, Any], element_bytes: int,
                      tp_size: int = 1) -> int | None:
    """KV bytes per token of a Hugging Face ``config.json`` (its ``text_config`` for a
    multimodal model), ``element_bytes`` per value, on ``tp_size`` tensor-parallel ranks
    (pipeline stages split the layers, so they change nothing here).

    Multi-head/grouped attention: ``layers x max(kv_heads, tp) x head_dim x 2`` (K and V; SGLang
    replicates a KV head on ranks beyond the head count). MLA (``kv_lora_rank``): one latent of
    ``kv_lora_rank + qk_rope_head_dim`` per layer, replicated on every TP rank."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" not in config:
        config = text
    layers = _int(config.get("num_hidden_layers"))
    if layers is None or element_bytes < 1:
        return None
    tp = max(1, tp_size)
    lora, rope = _int(config.get("kv_lora_rank")), _int(config.get("qk_rope_head_dim"))
    if lora is not None and rope is not None:
        return layers * (lora + rope) * element_bytes * tp
    heads = _int(config.get("num_attention_heads"))
    kv_heads = _int(config.get("num_key_value_heads")) or heads
    head_dim = _int(config.get("head_dim"))
    hidden = _int(config.get("hidden_size"))
    if head_dim is None and hidden is not None and heads is not None:
        head_dim = hidden // heads
    if kv_heads is None or not head_dim:
        return None
    return layers * max(kv_heads, tp) * head_dim * 2 * element_bytes


def from_server_info(server: Mapping[str, Any]) -> int | None:
    """KV bytes per token from SGLang's ``/server_info`` (0.5.23): rank 0's
    ``internal_states[0].memory_usage`` gives its KV pool (``kvcache``, GiB rounded to 3 digits)
    and how many tokens it holds (``token_capacity``); times ``tp_size x pp_size`` for the
    other ranks' shards. ``None`` when the answer lacks them (another engine, an older SGLang)."""
    states = server.get("internal_states")
    state = states[0] if isinstance(states, list) and states else None
    usage = state.get("memory_usage") if isinstance(state, Mapping) else None
    if not isinstance(usage, Mapping):
        return None
    gib, tokens = usage.get("kvcache"), _int(usage.get("token_capacity"))
    if not isinstance(gib, int | float) or isinstance(gib, bool) or gib <= 0 or tokens is None:
        return None
    ranks = (_int(server.get("tp_size")) or 1) * (_int(server.get("pp_size")) or 1)
    per_rank = round(gib * 2**30 / tokens)
    return per_rank * ranks if per_rank > 0 else None


def for_worker(model_path: str | None, server: Mapping[str, Any]) -> int | None:
    """A worker's KV bytes per token: from ``model_path``'s ``config.json`` when it can be read,
    in the dtype the engine keeps KV in (``server`` = its ``/server_info``: ``kv_cache_dtype``,
    else ``dtype``, else the checkpoint's, which SGLang's ``auto`` turns from float32 into
    float16) on its ``tp_size`` ranks; else :func:`from_server_info`."""
    config: Any = None
    if model_path:
        try:
            config = json.loads((Path(model_path) / "config.json").read_text())
        except (OSError, ValueError):
            config = None
    if isinstance(config, dict):
        checkpoint = config.get("torch_dtype") or config.get("dtype")
        element = dtype_bytes(server.get("kv_cache_dtype"), server.get("dtype")) or (
            2 if checkpoint in (None, "float32") else dtype_bytes(checkpoint) or 2)
        found = from_model_config(config, element, _int(server.get("tp_size")) or 1)
        if found is not None:
            return found
    return from_server_info(server)
