"""sglang_patch.cpu_compat: stand-ins, registry, and patch propagation into child interpreters.

Patches mutate ``sys.modules``/``sys.meta_path``, so every test that applies them runs in a fresh
interpreter (subprocess) and the test process itself stays clean.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sglang_patch import cpu_compat

PY = sys.executable


def _run(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(
        [PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout,
        env=env, cwd=str(cpu_compat.REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_non_cpu_device_is_a_no_op() -> None:
    # In a fresh interpreter: other tests in this process may have imported SGLang already.
    out = _run("""
        import sys
        from sglang_patch import cpu_compat
        before = list(sys.meta_path)
        result = cpu_compat.apply("cuda")
        assert result.applied == (), result
        assert sys.meta_path == before
        assert "sgl_kernel" not in sys.modules
        print("no-op")
    """)
    assert out.strip() == "no-op"


def test_stand_ins_import_and_raise_naming_the_op() -> None:
    out = _run("""
        from sglang_patch import cpu_compat
        first = cpu_compat.apply("cpu")
        second = cpu_compat.apply("cpu")
        assert first == second, (first, second)
        assert set(first.applied) >= {"torchvision-stand-in", "sgl-kernel-stand-in"}, first
        import sys
        from sglang_patch.stand_ins import StandInFinder
        finders = [f for f in sys.meta_path if isinstance(f, StandInFinder)]
        assert len(finders) == 2, finders  # idempotent: no duplicate finders
        import sgl_kernel.elementwise
        from sgl_kernel.flash_attn import flash_attn_varlen_func
        try:
            flash_attn_varlen_func(1, 2)
        except NotImplementedError as exc:
            print("RAISED", exc)
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.functional import InterpolationMode as IM2
        assert InterpolationMode.BICUBIC is IM2.BICUBIC
        from transformers.utils import import_utils
        print("TV", import_utils.is_torchvision_available())
        import os
        print("ENV", os.environ["SGLANG_USE_CPU_ENGINE"])
    """)
    assert "RAISED sgl_kernel.flash_attn.flash_attn_varlen_func was called" in out
    assert "TV False" in out
    assert "ENV 1" in out


def test_registry_runs_predicate_once_and_exports_module_for_children() -> None:
    out = _run("""
        from sglang_patch import cpu_compat
        calls = []
        cpu_compat.register_patch(cpu_compat.Patch(
            "needed", "test", lambda d: True, lambda: calls.append("needed")))
        cpu_compat.register_patch(cpu_compat.Patch(
            "not-needed", "test", lambda d: False, lambda: calls.append("not-needed")))
        r1 = cpu_compat.apply("cpu"); r2 = cpu_compat.apply("cpu")
        assert calls == ["needed"], calls
        assert "needed" in r1.applied and "not-needed" in r1.skipped and r1 == r2
        import os
        print("MODS", repr(os.environ[cpu_compat.ENV_PATCH_MODULES]))
        import json
        cpu_compat.register_patch(cpu_compat.Patch("j", "test", lambda d: True, json.dumps))
        print("ENV", cpu_compat.child_env()[cpu_compat.ENV_PATCH_MODULES])
    """)
    assert "MODS ''" in out  # a script's __main__ cannot be re-imported by children
    assert "ENV json" in out  # a module that registers a patch is re-imported by children


def test_child_interpreter_applies_patches_via_child_env() -> None:
    code = "import sgl_kernel, torchvision; print('CHILD', type(sgl_kernel).__name__)"
    out = _run(code, env=cpu_compat.child_env())
    assert "CHILD _StandInModule" in out
    # Negative control: the same child without child_env() cannot import the CUDA-only package.
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


def test_listed_patch_modules_survive_a_launcher_that_did_not_import_them() -> None:
    env = cpu_compat.child_env({cpu_compat.ENV_PATCH_MODULES: "json"})
    assert "json" in env[cpu_compat.ENV_PATCH_MODULES].split(",")
    out = _run("""
        import os, sys
        from sglang_patch import cpu_compat
        cpu_compat.import_listed_patch_modules()
        cpu_compat.apply("cpu")
        print("MODS", os.environ[cpu_compat.ENV_PATCH_MODULES], "json" in sys.modules)
    """, env={**cpu_compat.child_env(), cpu_compat.ENV_PATCH_MODULES: "json"})
    assert "MODS json True" in out


def test_child_env_is_unchanged_for_other_devices() -> None:
    base = {"PYTHONPATH": "/x"}
    assert cpu_compat.child_env(base, device="cuda") == base
    env = cpu_compat.child_env(base)
    assert env["PYTHONPATH"].split(":")[:2] == [str(cpu_compat.CHILD_SITE_DIR),
                                                str(cpu_compat.REPO_ROOT)]
    assert env["PYTHONPATH"].endswith("/x") and env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert cpu_compat.child_env(env)["PYTHONPATH"] == env["PYTHONPATH"]  # no duplicates


def test_launch_argv_carries_the_cpu_flags() -> None:
    argv = cpu_compat.launch_cpu_server_argv("/m", 1234, ["--page-size", "4"])
    assert argv[1:4] == ["-m", "sglang_patch.cpu_compat", "--"]
    joined = " ".join(argv)
    assert "--device cpu --attention-backend torch_native --sampling-backend pytorch" in joined
    assert joined.endswith("--disable-overlap-schedule --sleep-on-idle --page-size 4")


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_scheduler_imports_on_cpu() -> None:
    out = _run("""
        from sglang_patch import cpu_compat
        cpu_compat.apply("cpu")
        import sglang.srt.configs, sglang.srt.managers.scheduler
        print("IMPORTED")
    """, timeout=300)
    assert "IMPORTED" in out


@pytest.mark.sglang
@pytest.mark.slow
def test_module_launcher_runs_sglang_launch_server() -> None:
    proc = subprocess.run(
        [PY, "-m", "sglang_patch.cpu_compat", "--", "--help"], capture_output=True, text=True,
        timeout=300, env=cpu_compat.child_env(), cwd=str(cpu_compat.REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "--model-path" in proc.stdout and "--attention-backend" in proc.stdout


def test_disabled_patch_is_left_out() -> None:
    import os

    env = {**os.environ, cpu_compat.ENV_DISABLED: "torchvision-stand-in"}
    out = _run("""
        from sglang_patch import cpu_compat
        result = cpu_compat.apply("cpu")
        assert "torchvision-stand-in" not in result.applied, result
        assert "sgl-kernel-stand-in" in result.applied, result
        print("ok")
    """, env=env)
    assert out.strip() == "ok"


def test_lora_patch_gives_sglang_lora_an_unpinned_torch() -> None:
    """``sglang_patch.lora_cpu``: the tensor factories drop ``pin_memory`` (CPU torch has no
    pinned allocator), everything else is torch's own. The whole path runs in
    ``tests/router/test_lora_e2e.py`` (a real SGLang CPU server with an adapter)."""
    import torch

    from sglang_patch.lora_cpu import unpinned_torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA build pins memory for real")
    with pytest.raises(RuntimeError, match="pin"):
        torch.tensor([1, 2], pin_memory=True)
    shim = unpinned_torch(torch)
    assert shim.tensor([1, 2], dtype=torch.int32, pin_memory=True).tolist() == [1, 2]
    assert shim.zeros(3, pin_memory=True).sum().item() == 0
    assert shim.int32 is torch.int32 and shim.Tensor is torch.Tensor
