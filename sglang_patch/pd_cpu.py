"""SGLang's native PD disaggregation (Mooncake transfer engine over TCP) on ``--device cpu``.

One patch, registered with ``sglang_patch.cpu_compat`` and applied only for device ``cpu``:

- ``pd-mooncake-generic-page-indices``: ``disaggregation/prefill.py:_send_kv_chunk`` gives a
  sender that declares ``supports_host_tensor_indices`` (the Mooncake sender does,
  ``disaggregation/mooncake/conn.py`` ``MooncakeKVSender``) page indices copied into *pinned*
  host memory plus a ``torch.cuda.Event`` to wait on; a CPU-only torch has neither
  (``RuntimeError: pin_memory=True requires a CUDA or other accelerator backend``), and the
  prefill scheduler dies on the first KV send. With the attribute off, SGLang takes its generic
  path (``kv_to_page_indices``, numpy), which the Mooncake sender also accepts. On CPU the KV
  already lives in host memory, so nothing is lost. Measured: greedy output of a disaggregated
  request equals HF transformers' (``tests/sglang_patch/test_pd_native_e2e.py``).

How it reaches SGLang's scheduler process: the launch wrapper imports this module before it builds
``cpu_compat.child_env()``; ``RADIX_GLOBAL_CPU_PATCHES_DISABLE`` naming ``PATCH_NAME`` leaves it
out.
"""

from __future__ import annotations

from sglang_patch import cpu_compat

PATCH_NAME = "pd-mooncake-generic-page-indices"
MODULE = __name__
REASON = (
    "prefill.py _send_kv_chunk pins host memory and records a CUDA event for senders with "
    "supports_host_tensor_indices (Mooncake); CPU torch has no pinned allocator, so the prefill "
    "must take the generic numpy page-index path"
)


def _install() -> None:
    from sglang.srt.disaggregation.mooncake import conn

    conn.MooncakeKVSender.supports_host_tensor_indices = False


cpu_compat.register_patch(
    cpu_compat.Patch(PATCH_NAME, REASON, lambda device: device == "cpu", _install)
)
