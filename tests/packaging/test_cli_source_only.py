"""The subcommand that lives in benchmarks/ (not in the wheel) degrades to one clear line; the
tools (replay, cluster, simulate) are product modules."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

import radix_global_cli


def test_the_source_only_subcommands() -> None:
    assert {"bench"} == radix_global_cli.SOURCE_CHECKOUT_ONLY
    for name in ("replay", "cluster", "simulate"):
        assert radix_global_cli.SUBCOMMANDS[name][0].startswith("radix_global_tools."), name


@pytest.mark.parametrize("missing", ["benchmarks", "benchmarks.scenarios.bench"])
def test_without_benchmarks_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str],
                                                missing: str) -> None:
    real = importlib.import_module

    def import_module(name: str, *args: Any) -> Any:
        if name.startswith("benchmarks"):
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)
    assert radix_global_cli.main(["bench", "--help"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == ("radix-global bench: needs the source checkout (benchmarks/ is not in "
                       "the wheel)\n")


def test_a_missing_dependency_inside_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def import_module(name: str, *args: Any) -> Any:
        if name.startswith("benchmarks"):
            raise ModuleNotFoundError("No module named 'tqdm'", name="tqdm")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError, match="tqdm"):
        radix_global_cli.main(["bench", "--help"])
