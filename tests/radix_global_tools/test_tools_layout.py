"""The product packages (what the wheel carries) never import ``benchmarks`` (source checkout
only): the tools the benchmarks build on live in ``radix_global_tools``."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("radix_global", "radix_global_cli", "radix_global_tools", "router", "sglang_patch")


def _imported(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    found += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return found


def test_product_never_imports_benchmarks() -> None:
    offenders = [f"{path.relative_to(REPO)} imports {module}"
                 for package in PRODUCT for path in sorted((REPO / package).rglob("*.py"))
                 for module in _imported(path) if module.split(".")[0] == "benchmarks"]
    assert offenders == []


def test_the_simulator_calibrations_are_package_data() -> None:
    from radix_global_tools.simulate.config import CPU_CONFIG, DEFAULT_CONFIG

    assert DEFAULT_CONFIG.is_file() and CPU_CONFIG.is_file()
    assert DEFAULT_CONFIG.parent == REPO / "radix_global_tools" / "simulate"
