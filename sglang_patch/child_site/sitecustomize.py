"""Applies the CPU compatibility patches in SGLang's spawned child processes.

Only on ``PYTHONPATH`` when ``sglang_patch.cpu_compat.child_env()`` put it there; does nothing
unless ``RADIX_GLOBAL_CPU_COMPAT`` is set. See ``sglang_patch/cpu_compat.py`` for why.
"""

import os

if os.environ.get("RADIX_GLOBAL_CPU_COMPAT"):
    from sglang_patch.cpu_compat import apply_from_env

    apply_from_env()
