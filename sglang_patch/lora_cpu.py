"""SGLang's LoRA serving (``--enable-lora``, ``--lora-backend torch_native``) on ``--device cpu``.

One patch, registered with ``sglang_patch.cpu_compat`` and applied only for device ``cpu``:

- ``lora-unpinned-host-tensors``: SGLang's LoRA layers and backends stage small index tensors in
  *pinned* host memory (``torch.tensor(..., pin_memory=True)`` and friends, 26 sites in
  ``sglang/srt/lora``); a CPU-only torch has no pinned allocator (``RuntimeError: pin_memory=True
  requires a CUDA or other accelerator backend``) and the scheduler dies while loading the
  adapters; the torch-native backend also calls ``tensor.pin_memory()`` on every LoRA batch.
  The patch gives those modules a ``torch`` whose tensor factories drop ``pin_memory`` and, with
  no accelerator present, makes ``Tensor.pin_memory()`` return the tensor itself (it can only
  raise there). On CPU the tensors already are host memory, so nothing else changes.

How it reaches SGLang's scheduler process: the launch wrapper imports this module before it builds
``cpu_compat.child_env()``; ``RADIX_GLOBAL_CPU_PATCHES_DISABLE`` naming ``PATCH_NAME`` leaves it
out.
"""

from __future__ import annotations

import functools
import importlib
import types
from typing import Any

from sglang_patch import cpu_compat

PATCH_NAME = "lora-unpinned-host-tensors"
REASON = (
    "sglang/srt/lora pins host tensors (pin_memory=True); CPU torch has no pinned allocator, so "
    "the scheduler dies loading LoRA adapters"
)
_FACTORIES = ("tensor", "empty", "zeros", "ones", "full", "arange", "ones_like", "zeros_like",
              "empty_like", "cumsum", "repeat_interleave")
# The modules of the CPU path that pass pin_memory=True (the memory pool asks
# is_pin_memory_available() itself; the other backends are GPU-only).
MODULES = ("sglang.srt.lora.layers", "sglang.srt.lora.backend.torch_backend")


def unpinned_torch(torch: Any) -> types.SimpleNamespace:
    """``torch`` as seen by one module: every attribute the same, the factories without
    ``pin_memory``."""
    def drop_pin(fn: Any) -> Any:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            return fn(*args, **kwargs)
        return call

    class _Torch(types.SimpleNamespace):
        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

    return _Torch(**{name: drop_pin(getattr(torch, name)) for name in _FACTORIES})


def _pinned_is_host(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


def _install() -> None:
    import torch

    if not torch.cuda.is_available():
        torch.Tensor.pin_memory = _pinned_is_host  # type: ignore[method-assign,assignment]
    shim = unpinned_torch(torch)
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "torch", None) is torch:
            module.torch = shim  # type: ignore[attr-defined]


cpu_compat.register_patch(
    cpu_compat.Patch(PATCH_NAME, REASON, lambda device: device == "cpu", _install)
)
