"""The subcommands that live in benchmarks/ (not in the wheel) degrade to one clear line."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

import radix_global_cli


def test_the_source_only_subcommands() -> None:
    assert {"replay", "cluster", "bench", "simulate"} == radix_global_cli.SOURCE_CHECKOUT_ONLY


@pytest.mark.parametrize("missing", ["benchmarks", "benchmarks.replay"])
def test_without_benchmarks_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str],
                                                missing: str) -> None:
    real = importlib.import_module

    def import_module(name: str, *args: Any) -> Any:
        if name.startswith("benchmarks"):
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)
    assert radix_global_cli.main(["replay", "--help"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == ("radix-global replay: needs the source checkout (benchmarks/ is not in "
                       "the wheel)\n")


def test_a_missing_dependency_inside_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def import_module(name: str, *args: Any) -> Any:
        if name.startswith("benchmarks"):
            raise ModuleNotFoundError("No module named 'tqdm'", name="tqdm")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError, match="tqdm"):
        radix_global_cli.main(["replay", "--help"])
