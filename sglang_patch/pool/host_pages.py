"""Pages of SGLang's HiCache host pool as byte views, and the page key of a storage key: what
the storage backend (``sglang_patch/storage.py``) moves and names."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from radix_global.keys import storage_page_key

page_key_of = storage_page_key  # a storage key's PageKey (interfaces.md section "Page keys")


def bytes_view(t: torch.Tensor) -> np.ndarray:
    return t.reshape(-1).view(torch.uint8).numpy()


def page_views(host_pool: Any, index: int) -> list[np.ndarray] | None:
    """Byte views of the page starting at token slot ``index``, in a fixed order; None if this
    host pool's layout has no contiguous-chunk form (caller falls back to flat pages)."""
    layout = getattr(host_pool, "layout", None)
    kv = getattr(host_pool, "kv_buffer", None)
    ps = host_pool.page_size
    if not isinstance(kv, torch.Tensor) or kv.device.type != "cpu" or kv.dim() < 3:
        return None
    if layout == "layer_first" and kv.dim() == 5:
        return [bytes_view(kv[h, layer, index : index + ps])
                for h in range(kv.shape[0]) for layer in range(kv.shape[1])]
    if layout == "page_first" and kv.dim() == 5:
        return [bytes_view(kv[h, index : index + ps]) for h in range(kv.shape[0])]
    if layout in ("page_first_direct", "page_head") and kv.dim() == 6:
        return [bytes_view(kv[h, index // ps]) for h in range(kv.shape[0])]
    return None
