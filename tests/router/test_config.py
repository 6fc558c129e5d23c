"""RouterConfig: defaults feed the CLI, a file overrides defaults, flags override the file."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from router.cli.main import build_parser, config_from_args, main
from router.cluster.health import split_worker_spec
from router.config import ConfigError, RouterConfig, config_from_file
from router.routing.policies import PolicyConfigError, get_policy


def test_cli_defaults_are_the_dataclass_defaults():
    assert config_from_args([]) == RouterConfig()
    assert "default 30080" in build_parser().format_help()


def test_toml_and_yaml_files(tmp_path):
    toml = tmp_path / "r.toml"
    toml.write_text('[router]\nport = 9000\nworkers = ["http://127.0.0.1:1"]\n'
                    'policy = "least_load"\nheartbeat_timeout_s = 3\n'
                    '[router.policy_options]\nttft_slo_s = 2.5\n')
    cfg = config_from_file(toml)
    assert cfg.port == 9000 and cfg.workers == ("http://127.0.0.1:1",)
    assert cfg.heartbeat_timeout_s == 3.0 and cfg.policy_options == {"ttft_slo_s": 2.5}
    yaml = tmp_path / "r.yaml"
    yaml.write_text("port: 9001\nmax-body-bytes: 1024\n")
    cfg = config_from_file(yaml)
    assert cfg.port == 9001 and cfg.max_body_bytes == 1024


def test_flags_override_file(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('port = 9000\npolicy = "random"\n')
    cfg = config_from_args(["--config", str(path), "--port", "9100"])
    assert cfg.port == 9100 and cfg.policy == "random"


@pytest.mark.parametrize("text, match", [
    ("nope = 1\n", "unknown router option"),
    ('port = "x"\n', "port must be int"),
    ("port = true\n", "port must be int"),
    ("workers = 3\n", "workers must be a list"),
    ("port = [\n", "cannot parse"),
])
def test_bad_config_is_refused(tmp_path, text, match):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        config_from_file(path)
    assert main(["--config", str(path)]) == 2


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RouterConfig().port = 1  # type: ignore[misc]


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "router.toml"


def test_the_documented_example_config_is_valid():
    """docs/examples/router.toml: every key is a real option, its policy options build the policy,
    and its worker fragments parse (so the example cannot drift from the code unnoticed)."""
    cfg = config_from_file(EXAMPLE)
    assert cfg.policy == "conductor" and cfg.policy_options["ttft_headroom"] == 0.1
    policy = get_policy(cfg.policy, **cfg.policy_options)
    assert policy.slo.ttft_slo_s == 2.0  # type: ignore[attr-defined]
    assert [split_worker_spec(w)[1] for w in cfg.workers] == [
        {}, {"compute_domain": "cpu@host-a"}]
    assert cfg.lora_paths == {"sql-expert": "/adapters/sql-expert"}
    # Negative control: a misspelt option in the same file is refused.
    bad = EXAMPLE.read_text().replace("ttft_headroom", "ttft_headrom")
    with pytest.raises(PolicyConfigError, match="ttft_headrom"):
        get_policy(cfg.policy, **tomllib.loads(bad)["router"]["policy_options"])
