"""Run stock SGLang 0.5.23 on a CPU-only machine: import stand-ins plus a registry of named patches.

Contract
- ``apply(device="cpu")`` installs every registered patch whose predicate holds and returns the
  names applied (``AppliedPatches``). Idempotent. ``apply(device=<anything else>)`` does nothing:
  on a GPU machine the real packages are used untouched.
- ``register_patch(Patch(...))`` adds a patch (other modules, e.g. the HiCache host-pool patches,
  register theirs at import time). A patch = name + reason + predicate + install function.
- ``child_env(env)`` returns an environment under which every *spawned* Python child process
  applies the same patches before anything else runs (see "Child processes" below).
- ``launch_cpu_server_argv(model_path, port, extra)`` / ``python -m sglang_patch.cpu_compat --
  <sglang.launch_server args>`` start a real SGLang server on CPU.

Built-in patches
- ``torchvision-stand-in``: PyPI's torchvision cannot live beside the CPU torch (its native ops
  fail: ``operator torchvision::nms does not exist``) and installing a matching one pulls a CUDA
  torch, yet ``sglang.srt.configs`` and the multimodal processors import it at module level.
  Only ``transforms.InterpolationMode`` is touched at import time for a text model. transformers
  is imported (and its lru-cached ``is_torchvision_available()`` primed to False) *before* the
  stand-in exists, so transformers never routes image processing through it.
- ``sgl-kernel-stand-in``: there is no CPU build of ``sgl-kernel`` (CUDA-only wheels, no sdist),
  but ~130 SGLang modules import it at module level. The stand-in package imports fine and any
  submodule path resolves; every attribute is a callable that raises ``NotImplementedError``
  naming the op, so a CPU code path that really needs a CUDA kernel fails loudly, not silently.
  (``sglang-kernel``/``sglang_kernel`` appear in 0.5.23 only as distribution names in version
  checks, never as an import, so no stand-in is needed for them.)
- ``cpu-engine-env``: ``SGLANG_USE_CPU_ENGINE=1`` selects SGLang's CPU platform (``is_cpu()``).
- ``torch-native-prefix-extend``: the CPU attention backend computes only a request's new rows
  over a cached prefix, as GPU backends do (``sglang_patch/attention_cpu.py`` says why).

Child processes
SGLang starts its scheduler and detokenizer with ``multiprocessing`` *spawn*
(``mp.set_start_method("spawn", force=True)`` in ``sglang/srt/entrypoints/engine.py``): fresh
interpreters that unpickle their target and import SGLang before any of our code could run. We
therefore put ``sglang_patch/child_site`` on ``PYTHONPATH``: it holds only a ``sitecustomize.py``
that, when ``RADIX_GLOBAL_CPU_COMPAT=cpu``, imports the modules listed in
``RADIX_GLOBAL_CPU_PATCH_MODULES`` (so their ``register_patch`` calls run) and calls ``apply()``.
This works whatever the parent's main module is and for any spawn/Popen Python child; the venv
ships no sitecustomize of its own, so nothing is shadowed. The alternative (re-applying in the
main module when it runs as ``__mp_main__``) only works for one particular launcher.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from sglang_patch.stand_ins import StandInFinder, install_finder, real_package_works

ENV_FLAG = "RADIX_GLOBAL_CPU_COMPAT"
ENV_PATCH_MODULES = "RADIX_GLOBAL_CPU_PATCH_MODULES"
# Comma-separated patch names to leave out (an operator whose SGLang no longer needs one; the
# strict-xfail tests that prove a patch is still needed).
ENV_DISABLED = "RADIX_GLOBAL_CPU_PATCHES_DISABLE"
CHILD_SITE_DIR = Path(__file__).resolve().parent / "child_site"
REPO_ROOT = Path(__file__).resolve().parent.parent

# The flags that make SGLang 0.5.23 serve a small Llama on CPU (see the project's shared ENGINES.md,
# outside this repository, and docs/interfaces.md, "Test model, trace synthesis, SGLang on CPU").
# --sleep-on-idle: an idle scheduler otherwise busy-polls a whole core (measured 100% vs 1.5% of a
# core), so two idle engines alone saturate a 2-core machine.
CPU_SERVER_FLAGS: tuple[str, ...] = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--disable-overlap-schedule",
    "--sleep-on-idle",
)


@dataclass(frozen=True)
class Patch:
    """One named compatibility patch. ``predicate(device)`` decides whether it is needed."""

    name: str
    reason: str
    predicate: Callable[[str], bool]
    install: Callable[[], None]


class AppliedPatches(NamedTuple):
    device: str
    applied: tuple[str, ...]  # names installed by this or an earlier call
    skipped: tuple[str, ...]  # names whose predicate said "not needed"


_REGISTRY: dict[str, Patch] = {}
_APPLIED: set[str] = set()
_SKIPPED: set[str] = set()
_LOCK = threading.RLock()


def register_patch(patch: Patch) -> None:
    """Add ``patch``; re-registering the same name replaces it (module reloads in tests)."""
    with _LOCK:
        _REGISTRY[patch.name] = patch


def registered_patches() -> tuple[Patch, ...]:
    return tuple(_REGISTRY.values())


def apply(device: str = "cpu") -> AppliedPatches:
    """Install every needed registered patch for ``device``; a no-op unless ``device == "cpu"``."""
    if device != "cpu":
        return AppliedPatches(device, (), tuple(_REGISTRY))
    disabled = set(filter(None, os.environ.get(ENV_DISABLED, "").split(",")))
    with _LOCK:
        for patch in list(_REGISTRY.values()):
            if patch.name in _APPLIED or patch.name in _SKIPPED:
                continue
            if patch.name not in disabled and patch.predicate(device):
                patch.install()
                _APPLIED.add(patch.name)
            else:
                _SKIPPED.add(patch.name)
        os.environ[ENV_PATCH_MODULES] = ",".join(_patch_modules())
        os.environ[ENV_FLAG] = device
        return AppliedPatches(device, tuple(sorted(_APPLIED)), tuple(sorted(_SKIPPED)))


def _listed_modules(env: Mapping[str, str]) -> set[str]:
    return set(filter(None, env.get(ENV_PATCH_MODULES, "").split(",")))


def _patch_modules(env: Mapping[str, str] | None = None) -> list[str]:
    """Modules a child must import so their patches register (a script's __main__ cannot be).

    The union of this process's registry and what ``env`` already lists, so a launcher that did
    not import a patch module itself still hands it on to its children.
    """
    mods = {p.install.__module__ for p in _REGISTRY.values()} | _listed_modules(
        os.environ if env is None else env)
    return sorted(mods - {__name__, "__main__"})


def child_env(base: Mapping[str, str] | None = None, device: str = "cpu") -> dict[str, str]:
    """Environment for a child process that must apply the patches itself (see module doc)."""
    env = dict(os.environ if base is None else base)
    if device != "cpu":
        return env
    paths = [str(CHILD_SITE_DIR), str(REPO_ROOT)]
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[ENV_FLAG] = device
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env[ENV_PATCH_MODULES] = ",".join(_patch_modules(env))
    return env


def apply_from_env() -> AppliedPatches | None:
    """What ``child_site/sitecustomize.py`` runs: import listed patch modules, then ``apply``."""
    device = os.environ.get(ENV_FLAG, "")
    if not device:
        return None
    import_listed_patch_modules()
    return apply(device)


def import_listed_patch_modules() -> None:
    """Import every module ``RADIX_GLOBAL_CPU_PATCH_MODULES`` lists (their patches register)."""
    for name in sorted(_listed_modules(os.environ)):
        importlib.import_module(name)


# ---------------------------------------------------------------------------------------------
# Stand-in packages (the machinery is in sglang_patch/stand_ins.py)


def _torchvision_extras(module: ModuleType) -> None:
    if module.__name__.startswith("torchvision.transforms"):
        module.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]


def _make_interpolation_mode() -> Any:
    import enum

    members = {
        "NEAREST": "nearest", "NEAREST_EXACT": "nearest-exact", "BILINEAR": "bilinear",
        "BICUBIC": "bicubic", "BOX": "box", "HAMMING": "hamming", "LANCZOS": "lanczos",
    }
    return enum.Enum("InterpolationMode", members, module=__name__)


InterpolationMode = _make_interpolation_mode()

TORCHVISION_REASON = (
    "torchvision beside the CPU torch fails (torchvision::nms missing) and a matching one pulls a "
    "CUDA torch; SGLang imports it at module level but a text model never calls it"
)
SGL_KERNEL_REASON = (
    "sgl-kernel has no CPU build (CUDA-only wheels); SGLang imports it at module level but "
    "--device cpu with torch_native attention never calls it"
)


def _install_torchvision_stand_in() -> None:
    # transformers caches is_torchvision_available() on first use: prime it (False) before the
    # stand-in becomes findable, or transformers would route image processing through it.
    import transformers  # noqa: F401
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()
    install_finder(StandInFinder("torchvision", TORCHVISION_REASON, _torchvision_extras))


def _install_sgl_kernel_stand_in() -> None:
    install_finder(StandInFinder("sgl_kernel", SGL_KERNEL_REASON, lambda m: None))


def _install_cpu_engine_env() -> None:
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"


register_patch(Patch(
    "cpu-engine-env", "SGLANG_USE_CPU_ENGINE=1 selects SGLang's CPU platform",
    lambda device: True, _install_cpu_engine_env,
))
register_patch(Patch(
    "torchvision-stand-in", TORCHVISION_REASON,
    lambda device: not real_package_works("torchvision"), _install_torchvision_stand_in,
))
register_patch(Patch(
    "sgl-kernel-stand-in", SGL_KERNEL_REASON,
    lambda device: not real_package_works("sgl_kernel"), _install_sgl_kernel_stand_in,
))


def _install_prefix_extend() -> None:
    from sglang_patch import attention_cpu

    attention_cpu.install()


register_patch(Patch(
    "torch-native-prefix-extend",  # attention_cpu.PATCH_NAME (importing it here costs torch)
    "SGLang's torch_native extend attention recomputes a cached prefix's rows and drops them",
    lambda device: importlib.util.find_spec("sglang") is not None, _install_prefix_extend,
))


# ---------------------------------------------------------------------------------------------
# Launching a real server


def launch_cpu_server_argv(
    model_path: str | os.PathLike[str],
    port: int,
    extra: Sequence[str] = (),
    host: str = "127.0.0.1",
    python: str = sys.executable,
) -> list[str]:
    """argv that starts ``sglang.launch_server`` on CPU (run it with ``env=child_env()``)."""
    return [
        python, "-m", "sglang_patch.cpu_compat", "--",
        "--model-path", str(model_path), "--host", host, "--port", str(port),
        *CPU_SERVER_FLAGS, *extra,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sglang_patch.cpu_compat -- <sglang.launch_server args>``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    import_listed_patch_modules()
    apply("cpu")
    os.environ.update(child_env())
    import runpy

    sys.argv = ["sglang.launch_server", *args]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    # Run the canonical module's main: under `python -m` this file is also imported as
    # sglang_patch.cpu_compat (by child_site or by patch modules), and there must be ONE registry.
    from sglang_patch import cpu_compat as _canonical

    sys.exit(_canonical.main())
