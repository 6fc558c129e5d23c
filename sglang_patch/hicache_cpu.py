"""HiCache (SGLang's host-memory KV tier) on ``--device cpu``: four patches, registered with
``sglang_patch.cpu_compat`` and applied only for device ``cpu``.

- ``hicache-host-alloc-plain``: SGLang allocates the host KV pool through
  ``pool_host.common.ALLOC_MEMORY_FUNCS[device_type]``, whose default registers the buffer with
  ``cudaHostRegister`` (pinned memory for fast GPU<->host DMA). With no CUDA there is nothing to
  pin for and the call fails, so device ``cpu`` gets a plain ``torch.empty`` allocation.
- ``hicache-transfer-kv-direct-torch``: the ``direct`` I/O backend with the ``layer_first`` layout
  calls ``transfer_kv_direct`` from ``sgl_kernel.kvcacheio`` (CUDA) or SGLang's XPU module; on CPU
  ``pool_host.mha`` never imports it. We provide the same operation in pure torch: per layer,
  ``dst[dst_indices] = src[src_indices]`` (an index copy; the device "GPU" pool is host memory).

- ``hicache-host-reserve-small``: before allocating the host pool SGLang keeps
  ``HICACHE_HOST_MEMORY_RESERVE_BYTES`` = 10 GiB of RAM free for the rest of a GPU server. On a
  small CPU box (24 GiB, shared by several engines) that refuses even a 0.1 GB pool, so device
  ``cpu`` reserves 1 GiB instead (SGLang's own free-memory check still runs).

- ``hicache-host-unpinned``: a host pool keeps ``pin_memory`` and asks torch for pinned memory
  again when it builds the staging pages of an L3 read (``get_dummy_flat_data_page``, used by
  SGLang's own ``file`` storage backend); torch has no pinned allocator without an accelerator,
  so every L3 prefetch failed ("pin_memory=True requires a CUDA or other accelerator backend").
  A host pool on device ``cpu`` is built unpinned.

How they reach SGLang's scheduler process: ``cpu_compat.child_env()`` lists this module in
``RADIX_GLOBAL_CPU_PATCH_MODULES``, and the ``child_site/sitecustomize.py`` of every spawned
interpreter imports it and calls ``cpu_compat.apply("cpu")`` before SGLang builds any pool.
(``sglang_patch.storage`` also imports this module, but SGLang imports the storage backend only
after the host pool exists, so that import alone would be too late for the allocation patch.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sglang_patch import cpu_compat

ALLOC_REASON = (
    "the default host-pool allocator calls cudaHostRegister, which fails without CUDA; device "
    "'cpu' needs plain (unpinned) host memory"
)
TRANSFER_REASON = (
    "io backend 'direct' + layout 'layer_first' calls transfer_kv_direct, which exists only in "
    "CUDA/XPU kernels; on CPU an index copy per layer does the same"
)


def _alloc_plain(
    dims: tuple[int, ...],
    dtype: Any,
    device: str,
    pin_memory: bool,
    allocator: Any,
    registration_granularity_bytes: int | None = None,
) -> Any:
    import torch

    return torch.empty(dims, dtype=dtype, device=device)


def transfer_kv_direct_torch(
    src_layers: Sequence[Any],
    dst_layers: Sequence[Any],
    src_indices: Any,
    dst_indices: Any,
    page_size: int,
) -> None:
    """Copy the tokens ``src_indices`` of every source layer to ``dst_indices`` of its pair."""
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"{len(src_layers)} source layers vs {len(dst_layers)} destinations")
    src_idx = src_indices.to(dtype=__import__("torch").long)
    dst_idx = dst_indices.to(dtype=src_idx.dtype)
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_idx] = src[src_idx].to(dst.dtype)


def _install_alloc() -> None:
    from sglang.srt.mem_cache.pool_host import common

    common.ALLOC_MEMORY_FUNCS["cpu"] = _alloc_plain


def _install_transfer() -> None:
    from sglang.srt.mem_cache.pool_host import mha

    mha.transfer_kv_direct = transfer_kv_direct_torch


RESERVE_REASON = (
    "SGLang keeps 10 GiB of host RAM free before sizing the host pool (sized for GPU servers); a "
    "small shared CPU box then refuses even a 0.1 GB pool, so device 'cpu' keeps 1 GiB"
)
CPU_HOST_RESERVE_BYTES = 1 << 30


def _install_reserve() -> None:
    from sglang.srt.mem_cache.pool_host import base

    base.HICACHE_HOST_MEMORY_RESERVE_BYTES = CPU_HOST_RESERVE_BYTES


UNPINNED_REASON = (
    "a host pool asks torch for pinned staging pages on an L3 read (get_dummy_flat_data_page, "
    "SGLang's file backend); without an accelerator torch has no pinned allocator, so a host "
    "pool on device 'cpu' is built unpinned"
)


def _install_unpinned() -> None:
    import functools

    from sglang.srt.mem_cache.pool_host import base

    init = base.HostKVCache.__init__
    if getattr(init, "radix_global_unpinned", False):
        return

    @functools.wraps(init)
    def unpinned_init(self: Any, *args: Any, **kwargs: Any) -> None:
        # host pools always live in host memory; only on a CPU engine is there nothing to pin for
        init(self, *args, **{**kwargs, "pin_memory": False})

    unpinned_init.radix_global_unpinned = True  # type: ignore[attr-defined]
    base.HostKVCache.__init__ = unpinned_init


def _is_cpu(device: str) -> bool:
    return device == "cpu"


cpu_compat.register_patch(
    cpu_compat.Patch("hicache-host-alloc-plain", ALLOC_REASON, _is_cpu, _install_alloc)
)
cpu_compat.register_patch(
    cpu_compat.Patch("hicache-transfer-kv-direct-torch", TRANSFER_REASON, _is_cpu,
                     _install_transfer)
)
cpu_compat.register_patch(
    cpu_compat.Patch("hicache-host-reserve-small", RESERVE_REASON, _is_cpu, _install_reserve)
)
cpu_compat.register_patch(
    cpu_compat.Patch("hicache-host-unpinned", UNPINNED_REASON, _is_cpu, _install_unpinned)
)
