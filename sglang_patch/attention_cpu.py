"""Extend attention over a cached prefix for SGLang's ``torch_native`` backend (the CPU one).

Why: SGLang 0.5.23's ``TorchNativeAttnBackend._run_sdpa_forward_extend`` computes attention for
every position of a request, its cached prefix included, then keeps only the new rows (its
``per_req_query_redudant``). A prompt whose first 2,032 of 2,048 tokens are cached therefore
costs as much attention as a cold one: its first token took 0.33 s here (0.03 s with this patch,
0.80 s cold), where GPU backends (FlashInfer, Triton, FA3) compute only the new rows. On CPU a
cache hit saved only the projections and MLP, so every KV cache (device, host, L3) was worth a
fraction of what it is worth on a GPU.

What: :func:`extend_attention` computes the new rows only: queries of the extend part against the
keys of the whole sequence, with the causal mask shifted by the prefix length (row ``i`` sees key
``j`` iff ``j <= prefix + i``). With no prefix it is the backend's own square causal call. The
result is the same attention (tested against the stock method on random tensors); cross
attention, encoder-only layers and sliding windows keep the stock method.

It is a built-in patch of ``sglang_patch.cpu_compat`` (``torch-native-prefix-extend``), so every
SGLang engine started on CPU by this project, stock contenders of the benchmarks included, gets it;
``RADIX_GLOBAL_CPU_PATCHES_DISABLE=torch-native-prefix-extend`` runs SGLang's own.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import logging
import sys
from types import ModuleType
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

PATCH_NAME = "torch-native-prefix-extend"
BACKEND_MODULE = "sglang.srt.layers.attention.torch_native_backend"
STOCK_PARAMETERS = ["self", "query", "output", "k_cache", "v_cache", "req_to_token",
                    "req_pool_indices", "seq_lens", "extend_prefix_lens", "extend_seq_lens",
                    "encoder_lens", "scaling", "enable_gqa", "causal", "is_cross_attn",
                    "sliding_window_size"]
log = logging.getLogger(__name__)


def extend_attention(
    stock: Any,
    self: Any,
    query: torch.Tensor,
    output: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    encoder_lens: torch.Tensor | None = None,
    scaling: float | None = None,
    enable_gqa: bool = False,
    causal: bool = False,
    is_cross_attn: bool = False,
    sliding_window_size: int | None = None,
) -> torch.Tensor:
    """``_run_sdpa_forward_extend`` with the stock method's arguments (``stock``: that method,
    for the cases this one leaves to it). ``query``/``output``: [tokens, heads, head_dim]."""
    windowed = sliding_window_size is not None and sliding_window_size > -1
    if encoder_lens is not None or is_cross_attn or not causal or windowed:
        return stock(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                     seq_lens, extend_prefix_lens, extend_seq_lens, encoder_lens,
                     scaling=scaling, enable_gqa=enable_gqa, causal=causal,
                     is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    heads_first = query.movedim(0, 1)  # [heads, tokens, head_dim]
    start = 0
    for pool_index, n_kv, prefix, n_new in zip(req_pool_indices.tolist(), seq_lens.tolist(),
                                               extend_prefix_lens.tolist(),
                                               extend_seq_lens.tolist(), strict=True):
        end = start + n_new
        if n_new > 0:
            tokens = req_to_token[pool_index, :n_kv]
            key = k_cache[tokens].movedim(0, 1)
            value = v_cache[tokens].movedim(0, 1)
            q = heads_first[:, start:end, :]
            if not q.dtype == key.dtype == value.dtype:
                key, value = key.to(q.dtype), value.to(q.dtype)
            mask = None
            if prefix > 0:  # shifted causal mask: the square one would be wrong here
                rows = torch.arange(prefix, prefix + n_new, device=q.device).unsqueeze(1)
                mask = torch.arange(n_kv, device=q.device).unsqueeze(0) <= rows
            out = scaled_dot_product_attention(
                q.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), attn_mask=mask,
                is_causal=mask is None, scale=scaling, enable_gqa=enable_gqa)
            output[start:end] = out.squeeze(0).movedim(1, 0)
        start = end
    return output


def patch_backend(backend: Any) -> None:
    """Route ``backend._run_sdpa_forward_extend`` through :func:`extend_attention`. Idempotent.
    A method whose parameters are not the ones this was written against (another SGLang) is
    left as it is, with a warning: passing arguments into the wrong slots would be worse."""
    stock = backend._run_sdpa_forward_extend
    if getattr(stock, "__wrapped_stock__", None) is not None:
        return
    if list(inspect.signature(stock).parameters) != STOCK_PARAMETERS:
        log.warning("%s: %s._run_sdpa_forward_extend has other parameters than SGLang 0.5.23's; "
                    "left unpatched", PATCH_NAME, backend.__name__)
        return

    def patched(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return extend_attention(stock, self, *args, **kwargs)

    patched.__wrapped_stock__ = stock  # type: ignore[attr-defined]
    backend._run_sdpa_forward_extend = patched


class _PatchingLoader(importlib.abc.Loader):
    """The backend module's own loader, then the patch."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        backend = getattr(module, "TorchNativeAttnBackend", None)
        if backend is None:
            log.warning("%s: %s has no TorchNativeAttnBackend; left unpatched", PATCH_NAME,
                        BACKEND_MODULE)
        else:
            patch_backend(backend)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the backend class when SGLang imports its module: importing SGLang here, while
    the other CPU patches are still being applied, could fail or cost a child that never
    attends (the detokenizer)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != BACKEND_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install() -> None:
    module = sys.modules.get(BACKEND_MODULE)
    if module is not None:
        patch_backend(module.TorchNativeAttnBackend)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
