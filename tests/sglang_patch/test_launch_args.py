"""The wrapper's command line (``sglang_patch/launch_args.py``, docs/interfaces.md,
"Options: one config source per process"): our flags in a group of their own, SGLang's read by
SGLang's own parser."""

from __future__ import annotations

import pytest

from radix_global.options import all_options
from sglang_patch import launch_args
from sglang_patch.launch_args import (
    ENV_PREFIX,
    LaunchError,
    OurFlags,
    clashes,
    help_text,
    our_options,
    our_parser,
    parse_argv,
    sglang_parser,
)

BASE = ["--model-path", "/m", "--device", "cpu"]
OLD_TO_NEW = {
    "--advertise-host": "--radix-global-advertise-host",
    "--event-port-base": "--radix-global-event-port-base",
    "--worker-id": "--radix-global-worker-id", "--admin-token": "--radix-global-admin-token",
    "--role": "--radix-global-role", "--namespace": "--radix-global-namespace",
    "--pool": "--radix-global-pool", "--pool-id": "--radix-global-pool-id",
    "--pool-capacity-gb": "--radix-global-pool-capacity-gb",
    "--pool-root": "--radix-global-pool-root", "--pool-disk": "--radix-global-pool-disk",
    "--pool-disk-gb": "--radix-global-pool-disk-gb",
    "--pool-load-probe-tokens": "--radix-global-pool-load-probe-tokens",
    "--heartbeat-interval": "--radix-global-heartbeat-interval-s",
}


def test_no_flag_of_ours_is_an_sglang_flag() -> None:
    """A flag of ours that SGLang also defines would take SGLang's meaning away: refused here.
    Our old spellings that SGLang defines (none in 0.5.23) are left to SGLang."""
    sglang = sglang_parser().flags
    ours, old = clashes(sglang)
    assert ours == [], f"radix-global flags that SGLang also defines: {ours}"
    assert old == [], f"old spellings SGLang now defines (they are SGLang's): {old}"
    flags = {o.flag for o in our_options()}
    assert all(f == "--radix-global" or f.startswith("--radix-global-") for f in flags)
    assert not [f for f in sglang if f.startswith("--radix-global")]


def test_the_clash_check_catches_a_planted_sglang_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control of the test above: one of ours spelt as an SGLang flag."""

    class Planted(launch_args.WrapperOption):
        __slots__ = ()

        @property
        def flag(self) -> str:
            return "--served-model-name" if self.name == "namespace" else super().flag

    monkeypatch.setattr(launch_args, "our_options",
                        lambda: [Planted(*o) for o in all_options([launch_args.SECTION])])
    assert clashes(sglang_parser().flags)[0] == ["--served-model-name"]
    with pytest.raises(LaunchError, match="also SGLang's"):
        parse_argv(BASE, {})


def test_the_old_spellings_work_with_a_deprecation_line(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert {a: o.flag for o in our_options() for a in o.aliases} == OLD_TO_NEW
    args = parse_argv([*BASE, "--pool-id", "p", "--role", "decode", "--heartbeat-interval", "2",
                       "--radix-global-namespace", "m@1"], {})
    assert (args.flags.pool_id, args.flags.role, args.flags.heartbeat_interval_s,
            args.flags.namespace) == ("p", "decode", 2.0, "m@1")
    assert capsys.readouterr().err.splitlines() == [
        "radix-global sglang: --pool-id is deprecated; use --radix-global-pool-id",
        "radix-global sglang: --role is deprecated; use --radix-global-role",
        "radix-global sglang: --heartbeat-interval is deprecated; use "
        "--radix-global-heartbeat-interval-s"]
    assert args.sglang.argv == tuple(BASE)  # ours never reach SGLang


def test_an_old_spelling_sglang_defines_is_sglangs() -> None:
    """Were SGLang to define --pool, ``--pool X`` would be its flag, not ours."""
    ours, rest = our_parser(taken={"--pool"}).parse_known_args(["--pool", "x", "--pool-id", "p"])
    assert vars(ours) == {"pool_id": "p"} and rest == ["--pool", "x"]


@pytest.mark.parametrize("argv, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--radix-global-pool-i", "p"], "unrecognized arguments: --radix-global-pool-i"),  # no abbrev
    (["--port", "x"], "argument --port: invalid int value: 'x'"),
    (["--hicache-write-policy", "sometimes"], "argument --hicache-write-policy: invalid choice"),
    (["--radix-global-role", "both"], "--radix-global-role must be one of mixed, prefill, "
                                      "decode"),
    (["--radix-global-pool-disk-gb", "0"], "--radix-global-pool-disk-gb must be a number > 0"),
    (["--radix-global-event-port-base", "70000"], "--radix-global-event-port-base must be an "
                                                  "integer or unset in [1, 65535]"),
])
def test_a_bad_flag_is_one_line_and_exit_2_before_anything_starts(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_patch import launch_server

    def start(plan: object) -> None:
        raise AssertionError("started SGLang")

    monkeypatch.setattr(launch_server, "_start", start)
    assert launch_server.main([*BASE, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("radix-global sglang: error: " + message), err
    assert err.count("\n") == 1, err


def test_environment_then_flags() -> None:
    env = {f"{ENV_PREFIX}POOL_ID": "from-env", f"{ENV_PREFIX}URL": "http://r:1",
           "RADIX_GLOBAL_ADMIN_TOKEN": "shared", f"{ENV_PREFIX}HEARTBEAT_INTERVAL_S": "3"}
    flags = parse_argv(BASE, env).flags
    assert (flags.pool_id, flags.radix_global, flags.admin_token,
            flags.heartbeat_interval_s) == ("from-env", "http://r:1", "shared", 3.0)
    assert parse_argv(BASE, {**env, f"{ENV_PREFIX}ADMIN_TOKEN": "own"}).flags.admin_token == "own"
    assert parse_argv([*BASE, "--radix-global-pool-id", "flag"], env).flags.pool_id == "flag"
    assert parse_argv(BASE, {}).flags == OurFlags()


def test_sglang_values_come_from_sglangs_parser() -> None:
    """SGLang's aliases and ``--x=V`` are read as SGLang reads them."""
    from sglang_patch.launch_plan import build_plan

    plan = build_plan(["--model", "/m", "--device=cpu", "--enable-hicache", "--port=31001",
                       "--data-parallel-size", "2", "--radix-global", "http://r:1",
                       "--radix-global-event-port-base", "5500"], environ={})
    assert plan.model_path == "/m" and plan.port == 31001 and plan.device == "cpu"
    assert "--enable-hierarchical-cache" not in plan.sglang_argv  # the user's alias is kept
    assert plan.pool_events_endpoint == "tcp://127.0.0.1:5504"  # dp 2: 5500, 5502, 5504


def test_help_lists_every_flag_with_its_help_bounds_and_variable() -> None:
    text = " ".join(help_text().split())
    for o in our_options():
        assert o.help, o.name
        assert o.flag in text and f"env {ENV_PREFIX}{o.name.upper()}" in text, o.name
        if o.hint in (int, float, int | None, float | None):
            assert o.bounds(), f"{o.name}: a number without bounds"
    for old in OLD_TO_NEW:
        assert f" {old} " not in text  # old spellings are not advertised
