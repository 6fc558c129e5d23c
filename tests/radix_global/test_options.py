"""radix_global/options.py: one declaration -> flags, environment, help, TOML, checks."""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest

from radix_global.options import (
    OptionError,
    Section,
    add_flags,
    all_options,
    build,
    check_names,
    declaration_problems,
    env_values,
    example_toml,
    opt,
)


@dataclass(frozen=True)
class Gate:
    """Dispatch."""

    order: Annotated[Literal["fifo", "off"], opt("send order", name="dispatch")] = "fifo"
    depth: Annotated[int, opt("requests per server", ge=1, le=64)] = 2
    share: Annotated[float, opt("a share", ge=0, lt=1)] = 0.5
    slo_s: Annotated[float | None, opt("an SLO", gt=0)] = None  # bounds apply when set
    on: Annotated[bool, opt("a switch")] = True
    urls: Annotated[tuple[str, ...], opt("URLs", aliases=("--worker-urls",))] = ()
    table: Annotated[dict[str, str], opt("a table")] = field(default_factory=dict)


SECTION = Section("gate", Gate, "dispatch_")


def test_names_bounds_and_help_come_from_the_declaration() -> None:
    by = {o.name: o for o in all_options([SECTION])}
    assert sorted(by) == ["dispatch", "dispatch_depth", "dispatch_on", "dispatch_share",
                          "dispatch_slo_s", "dispatch_table", "dispatch_urls"]
    assert by["dispatch_depth"].bounds() == "in [1, 64]"
    assert by["dispatch_share"].bounds() == "in [0, 1)"
    assert by["dispatch_slo_s"].bounds() == "> 0"
    assert by["dispatch"].bounds() == "one of fifo, off"
    assert by["dispatch_urls"].aliases == ("--worker-urls",)


def test_build_converts_text_and_refuses_in_one_line_naming_the_option() -> None:
    g = build(SECTION, {"dispatch_depth": "3", "dispatch_share": 0, "dispatch_slo_s": "1.5",
                        "dispatch_urls": ["a", "b"]})
    assert (g.depth, g.share, g.slo_s, g.urls) == (3, 0.0, 1.5, ("a", "b"))
    assert build(SECTION, {}) == Gate()
    for values, message in (
            ({"dispatch_depth": 0}, "dispatch_depth must be an integer in [1, 64], got 0"),
            ({"dispatch_depth": "x"}, "dispatch_depth must be an integer, got 'x'"),
            ({"dispatch_share": 1.0}, "dispatch_share must be a number in [0, 1), got 1.0"),
            ({"dispatch_share": float("nan")}, "dispatch_share must be a finite number"),
            ({"dispatch_slo_s": "inf"}, "dispatch_slo_s must be a finite number"),
            ({"dispatch": "lifo"}, "dispatch must be one of fifo, off, got 'lifo'")):
        with pytest.raises(OptionError) as err:
            build(SECTION, values)
        assert str(err.value).startswith(message), err.value
        assert "\n" not in str(err.value)


def test_flags_environment_and_names() -> None:
    options = all_options([SECTION])
    parser = argparse.ArgumentParser()
    add_flags(parser, options, "RG_")
    args = vars(parser.parse_args(["--dispatch-depth", "4", "--worker-urls", "u1", "u2",
                                   "--no-dispatch-on"]))
    assert args == {"dispatch_depth": "4", "dispatch_urls": ["u1", "u2"], "dispatch_on": False}
    assert "env RG_DISPATCH_DEPTH" in " ".join(parser.format_help().split())
    env = env_values(options, {"RG_DISPATCH_URLS": "a, b c", "RG_DISPATCH_SLO_S": "",
                               "RG_DISPATCH_ON": "off", "OTHER": "1"}, "RG_")
    assert env == {"dispatch_urls": ["a", "b", "c"], "dispatch_slo_s": None, "dispatch_on": False}
    with pytest.raises(OptionError, match="dispatch_on must be one of 1/0"):
        env_values(options, {"RG_DISPATCH_ON": "maybe"}, "RG_")
    assert check_names(options, {"dispatch-depth": 1, "worker_urls": ["x"]}, "test") == {
        "dispatch_depth": 1, "dispatch_urls": ["x"]}
    with pytest.raises(OptionError, match="unknown test option 'depth'"):
        check_names(options, {"depth": 1}, "test")


def test_a_name_declared_twice_is_refused() -> None:
    @dataclass(frozen=True)
    class Other:
        depth: Annotated[int, opt("x")] = 1

    with pytest.raises(ValueError, match="declared twice"):
        all_options([SECTION, Section("o", Other, "dispatch_")])


def test_the_example_toml_reads_back_as_the_defaults() -> None:
    text = example_toml("test", [SECTION])
    data = tomllib.loads(text)
    assert build(SECTION, data) == Gate()
    assert "# requests per server (in [1, 64])" in text
    assert "# dispatch_slo_s = ..." in text  # unset by default: commented out


def test_the_index_service_and_the_wrapper_declare_help_and_bounds_for_every_option() -> None:
    """The router's own test does the same for its sections (tests/router/test_config.py)."""
    from radix_global.service_config import SECTIONS as INDEX
    from sglang_patch.launch_args import SECTION as WRAPPER

    assert declaration_problems(all_options(INDEX)) == []
    assert declaration_problems(all_options([WRAPPER])) == []
    # negative control: the same check on a declaration without help and without bounds
    @dataclass(frozen=True)
    class Bad:
        quiet: Annotated[int, opt("", ge=0)] = 1
        free: Annotated[float, opt("a number")] = 1.0

    assert declaration_problems(all_options([Section("b", Bad)])) == [
        "quiet: no help", "free: a number without bounds"]
