"""RouterConfig: defaults < file < environment < flags; every field is all three; one config
reaches every part of the router; a bad option is one line and exit status 2."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
import tomllib
import typing
from pathlib import Path

import pytest

import radix_global_cli
from router.cli.main import ALIASES, ENV_PREFIX, build_parser, config_from_args, main
from router.cluster.discovery import split_worker_spec
from router.config import FIELDS, ConfigError, RouterConfig, config_from_file
from router.routing.cost import CostConfig
from router.routing.policies import PolicyConfigError, get_policy
from router.state import RouterState

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "router.toml"
HINTS = typing.get_type_hints(RouterConfig)


def test_cli_defaults_are_the_dataclass_defaults():
    assert config_from_args([], environ={}) == RouterConfig()
    assert "default 30080" in build_parser().format_help()


def test_toml_and_yaml_files(tmp_path):
    toml = tmp_path / "r.toml"
    toml.write_text('[router]\nport = 9000\nworkers = ["http://127.0.0.1:1"]\n'
                    'policy = "least_load"\nheartbeat_timeout_s = 3\nttft_slo_s = 2.5\n')
    cfg = config_from_file(toml)
    assert cfg.port == 9000 and cfg.workers == ("http://127.0.0.1:1",)
    assert cfg.heartbeat_timeout_s == 3.0 and cfg.slo_config().ttft_slo_s == 2.5
    yaml = tmp_path / "r.yaml"
    yaml.write_text("port: 9001\nmax-body-bytes: 1024\n")
    cfg = config_from_file(yaml)
    assert cfg.port == 9001 and cfg.max_body_bytes == 1024


def test_flags_override_environment_override_file(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('port = 9000\npolicy = "random"\nmax_retries = 5\n')
    env = {"RADIX_GLOBAL_PORT": "9050", "RADIX_GLOBAL_MAX_RETRIES": "4"}
    cfg = config_from_args(["--config", str(path), "--port", "9100"], environ=env)
    assert (cfg.port, cfg.max_retries, cfg.policy) == (9100, 4, "random")


def _sample(name: str) -> tuple[str, object]:
    """A non-default value of field ``name`` as env text, and what it must become."""
    hint, default = HINTS[name], getattr(RouterConfig(), name)
    inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    kind = typing.get_origin(inner[0]) or inner[0]
    special: dict[str, tuple[str, object]] = {
        "policy": ("least_load", "least_load"), "pd_mode": ("pool", "pool"),
        "pd_ratio": ("2:3", "2:3"), "log_level": ("debug", "debug"),
        "dispatch": ("fifo", "fifo"),
        "ttft_headroom": ("0.25", 0.25), "engine_queue_weight": ("0.75", 0.75),
        "policy_options": ("fetch_ratio=1.5 min_fetch_pages=3",
                           {"fetch_ratio": 1.5, "min_fetch_pages": 3}),
        "lora_paths": ("a=/x b=/y", {"a": "/x", "b": "/y"}),
        "workers": ("http://h:1,http://h:2", ("http://h:1", "http://h:2")),
    }
    if name in special:
        return special[name]
    if kind is bool:
        return ("0", False) if default else ("yes", True)
    if kind is int:
        return str((default or 0) + 7), (default or 0) + 7
    if kind is float:
        return str((default or 0.0) + 1.5), (default or 0.0) + 1.5
    return "some-text", "some-text"


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_is_a_flag_and_an_environment_variable(name):
    flags = {s for a in build_parser()._actions for s in a.option_strings}
    assert f"--{name.replace('_', '-')}" in flags
    text, want = _sample(name)
    cfg = config_from_args([], environ={ENV_PREFIX + name.upper(): text})
    assert getattr(cfg, name) == want and getattr(cfg, name) != getattr(RouterConfig(), name)


def test_ttft_slo_from_the_command_line_reaches_the_conductor():
    cfg = config_from_args(["--ttft-slo-s", "1.5", "--ttft-headroom", "0.2"], environ={})
    state = RouterState(cfg)
    assert state.routing.policy.slo.ttft_slo_s == 1.5  # type: ignore[attr-defined]
    assert state.routing.policy.slo is state.routing.slo  # type: ignore[attr-defined]


def test_worker_urls_and_index_are_aliases():
    assert ALIASES["workers"] == ["--worker-urls"]
    cfg = config_from_args(["--worker-urls", "http://a:1", "http://b:2", "--index", "h:5"],
                           environ={})
    assert cfg.workers == ("http://a:1", "http://b:2") and cfg.index_url == "h:5"


def test_one_config_reaches_every_part():
    """No islands: the live router's cost model, SLO (driver and conductor), decode selection,
    warming planner and PD config are built from the RouterConfig, not from their defaults."""
    cfg = RouterConfig(policy="conductor", engine_queue_weight=0.25, kv_bytes_per_token=4096,
                       default_bandwidth_bytes_per_s=1e9, transfer_overhead_s=0.01,
                       learn_from_inferred_prefill=True, ttft_slo_s=3.0, pd_tbt_slo_s=0.2,
                       max_retry_after_s=9.0, decode_tbt_base_s=0.03,
                       decode_default_output_tokens=64, warm_min_pages=5, warm_cooldown_s=7.0,
                       pd_mode="pool", pd_ratio="1:2", pd_decode_attempts=3,
                       pd_pool_ready_poll_s=0.05, drag_half_life=16.0, dispatch="fifo",
                       dispatch_depth=3, dispatch_max_hold_s=2.0, dispatch_timeout_s=9.0)
    state = RouterState(cfg)
    assert state.routing.cost.config == cfg.cost_config()
    assert state.routing.cost.config.kv_bytes_per_token == 4096
    assert state.routing.cost.config.drag_half_life == 16.0
    assert state.routing.slo == cfg.slo_config()
    assert state.routing.policy.slo is state.routing.slo  # type: ignore[attr-defined]
    assert state.routing.decode.config == cfg.decode_config()
    assert state.warmer.planner.config == cfg.warm_config()
    assert state.pd_pool is not None and state.pd_pool.orch.config == cfg.pd_config()
    assert state.pd_pool.orch.config.decode_attempts == 3
    assert state.pd_util.config == cfg.pd_config()
    gate = state.routing.gate
    assert gate is not None and gate.depth == 3 and gate.order.name == "fifo"
    assert cfg.dispatch_config().timeout_s == 9.0


def test_learn_from_inferred_prefill_has_one_default():
    assert RouterConfig().learn_from_inferred_prefill is CostConfig().learn_from_inferred_prefill
    assert RouterConfig().cost_config() == CostConfig()
    assert "heartbeat_interval_s" not in FIELDS  # dead (the router never sent heartbeats)


@pytest.mark.parametrize("argv, env, match", [
    (["--bogus"], {}, "unrecognized arguments: --bogus"),
    (["--port", "x"], {}, "invalid int value"),
    (["--config", "/nonexistent/r.toml"], {}, "cannot read config file"),
    (["--policy-options", "fetch_ratoi=2"], {}, "valid options: fetch_ratio, "),
    (["--policy-options", "fetch_ratio=fast"], {}, "fetch_ratio must be float"),
    (["--policy", "fastest"], {}, "unknown policy 'fastest'; known: random"),
    (["--policy-options", "ttft_slo_s=2"], {}, "router option, not a policy option"),
    ([], {"RADIX_GLOBAL_TTFT_HEADROOM": "1.5"}, "ttft_headroom must be in"),
    ([], {"RADIX_GLOBAL_LEARN_FROM_INFERRED_PREFILL": "maybe"}, "must be one of 1/0"),
    (["--log-level", "loud"], {}, "log_level must be"),
    (["--drag-half-life", "-1"], {}, "drag_half_life must be >= 0"),
])
def test_a_bad_option_is_one_line_and_exit_2(argv, env, match, capsys, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and match in err, err


@pytest.mark.parametrize("text, match", [
    ("nope = 1\n", "unknown router option"),
    ('port = "x"\n', "port must be int"),
    ("port = true\n", "port must be int"),
    ("workers = 3\n", "workers must be list of str"),
    ("port = [\n", "cannot parse"),
])
def test_bad_config_is_refused(tmp_path, text, match, capsys):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        config_from_file(path)
    assert main(["--config", str(path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_version(capsys):
    assert main(["--version"]) == 0
    assert radix_global_cli.main(["--version"]) == 0
    out = capsys.readouterr().out.split()
    version = radix_global_cli.package_version()
    assert out == ["radix-global", version, "radix-global", version] and version[0].isdigit()


def test_version_of_a_source_tree_that_was_never_installed(monkeypatch):
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    pyproject = tomllib.loads((EXAMPLE.parents[2] / "pyproject.toml").read_text())
    assert radix_global_cli.package_version() == pyproject["project"]["version"]


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RouterConfig().port = 1  # type: ignore[misc]


def example_keys(text: str) -> set[str]:
    """Keys of ``[router]`` in the example, set or shown commented out (``# key = ...``)."""
    shown = set(re.findall(r"^# (\w+) = ", text, re.M))
    return shown | set(tomllib.loads(text)["router"])


def test_the_documented_example_lists_every_field():
    missing = set(FIELDS) - example_keys(EXAMPLE.read_text())
    assert not missing, f"docs/examples/router.toml lacks {sorted(missing)}"
    # Negative control: an entry taken out is noticed.
    cut = re.sub(r"^warm_cooldown_s = .*\n", "", EXAMPLE.read_text(), flags=re.M)
    assert set(FIELDS) - example_keys(cut) == {"warm_cooldown_s"}


def test_the_documented_example_config_is_valid():
    """docs/examples/router.toml: every key is a real option, its policy options build the policy,
    and its worker fragments parse (so the example cannot drift from the code unnoticed)."""
    cfg = config_from_file(EXAMPLE)
    assert cfg.policy == "conductor" and cfg.policy_options["fetch_ratio"] == 1.25
    policy = get_policy(cfg.policy, cfg.slo_config(), **cfg.policy_options)
    assert policy.slo.ttft_slo_s == 2.0  # type: ignore[attr-defined]
    assert [split_worker_spec(w)[1] for w in cfg.workers] == [
        {}, {"compute_domain": "cpu@host-a"}]
    assert cfg.lora_paths == {"sql-expert": "/adapters/sql-expert"}
    # Negative control: a misspelt option in the same file is refused, naming the valid ones.
    bad = EXAMPLE.read_text().replace("min_fetch_pages", "min_fetch_page")
    with pytest.raises(PolicyConfigError, match=r"min_fetch_page.*valid options"):
        get_policy(cfg.policy, **tomllib.loads(bad)["router"]["policy_options"])
