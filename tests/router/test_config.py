"""RouterConfig: the parts' option sections (docs/interfaces.md,
"Options: one config source per process"); defaults < file < environment < flags; flags,
environment, --help and the example file come from the declarations; every option is declared with
help and bounds; every flag of before still parses to the same config; a bad option is one line and
exit status 2."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
import tomllib
import typing
from pathlib import Path
from typing import Annotated, Any

import pytest

import radix_global_cli
from radix_global.options import (
    Section,
    all_options,
    declaration_problems,
    literal_choices,
    opt,
)
from router.cli.main import ENV_PREFIX, build_parser, config_from_args, main
from router.config import (
    SECTIONS,
    ConfigError,
    PolicyConfig,
    RouterConfig,
    config_from_file,
    example_config,
    options,
)
from router.routing.cost import CostConfig
from router.routing.policies import get_policy, policy_names
from router.state import RouterState

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "router.toml"
OPTIONS = {o.name: o for o in options()}


def value(cfg: RouterConfig, name: str) -> Any:
    o = OPTIONS[name]
    return getattr(getattr(cfg, o.section), o.field)


# --- declarations ------------------------------------------------------------------------------

# Numeric options without bounds, each with the reason no bound makes sense. Empty today: keep it
# that way unless a number really can take any value.
UNBOUNDED: dict[str, str] = {}


def check_declarations(opts: Any) -> list[str]:
    return declaration_problems(opts, UNBOUNDED)


def test_every_option_has_help_and_every_number_bounds():
    assert check_declarations(options()) == []
    assert set(UNBOUNDED) <= set(OPTIONS)


@dataclasses.dataclass(frozen=True)
class _Bad:
    quiet: Annotated[int, opt("", ge=0)] = 1
    unbounded: Annotated[float, opt("a number")] = 1.0


def test_the_declaration_check_catches_a_missing_help_or_bound():
    """Negative control, in code: a section with an option without help and one without bounds
    is refused by the same check."""
    assert check_declarations(all_options([Section("bad", _Bad)])) == [
        "quiet: no help", "unbounded: a number without bounds"]


def test_sections_are_the_config_attributes_and_policies_the_choices():
    assert [s.attr for s in SECTIONS] == [f.name for f in dataclasses.fields(RouterConfig)]
    for s in SECTIONS:
        assert typing.get_type_hints(RouterConfig)[s.attr] is s.cls
    assert list(literal_choices(OPTIONS["policy"].hint)) == policy_names()


# --- sources -----------------------------------------------------------------------------------

def test_cli_defaults_are_the_dataclass_defaults():
    assert config_from_args([], environ={}) == RouterConfig() == RouterConfig.from_options()
    assert "default 30080" in " ".join(build_parser().format_help().split())


def test_from_options_and_replace():
    cfg = RouterConfig.from_options(dispatch="fifo", ttft_slo_s=2, max_body_bytes=1024)
    assert (cfg.dispatch.order, cfg.slo.ttft_slo_s, cfg.client.max_body_bytes) == ("fifo", 2.0,
                                                                                    1024)
    assert cfg.replace(port=1).listen.port == 1 and cfg.replace(port=1).dispatch.order == "fifo"
    assert RouterConfig().to_options() == {o.name: o.default for o in options()}
    with pytest.raises(ConfigError, match="unknown router option 'dispatch_deph'"):
        RouterConfig.from_options(dispatch_deph=3)
    with pytest.raises(ConfigError, match="unknown router option 'nope'"):
        RouterConfig().replace(nope=1)


def test_toml_and_yaml_files(tmp_path):
    toml = tmp_path / "r.toml"
    toml.write_text('[router]\nport = 9000\nworkers = ["http://127.0.0.1:1"]\n'
                    'policy = "least_load"\nheartbeat_timeout_s = 3\nttft_slo_s = 2.5\n')
    cfg = config_from_file(toml)
    assert cfg.listen.port == 9000 and cfg.health.workers == ("http://127.0.0.1:1",)
    assert cfg.health.heartbeat_timeout_s == 3.0 and cfg.slo.ttft_slo_s == 2.5
    yaml = tmp_path / "r.yaml"
    yaml.write_text("port: 9001\nmax-body-bytes: 1024\nworkers: http://h:1\n")
    cfg = config_from_file(yaml)
    assert cfg.listen.port == 9001 and cfg.client.max_body_bytes == 1024
    assert cfg.health.workers == ("http://h:1",)


def test_flags_override_environment_override_file(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('port = 9000\npolicy = "random"\nmax_retries = 5\n')
    env = {"RADIX_GLOBAL_PORT": "9050", "RADIX_GLOBAL_MAX_RETRIES": "4"}
    cfg = config_from_args(["--config", str(path), "--port", "9100"], environ=env)
    assert (cfg.listen.port, cfg.proxy.max_retries, cfg.policy.name) == (9100, 4, "random")


def test_a_zero_slo_is_off_as_before():
    """The SLOs are ``float | None`` (> 0 when set); 0 from a file, the environment or a flag
    still means none, as it did."""
    assert RouterConfig().slo.ttft_slo_s is None and RouterConfig().slo.tbt_slo_s is None
    cfg = config_from_args(["--ttft-slo-s", "0"], environ={"RADIX_GLOBAL_PD_TBT_SLO_S": "0"})
    assert cfg.slo.ttft_slo_s is None and cfg.slo.tbt_slo_s is None
    assert config_from_args([], environ={"RADIX_GLOBAL_TTFT_SLO_S": ""}).slo.ttft_slo_s is None
    assert RouterConfig.from_options(pd_tbt_slo_s=0.2).slo.tbt_slo_s == 0.2
    assert RouterConfig.from_options(ttft_slo_s=0, pd_tbt_slo_s="0.0").slo == RouterConfig().slo
    assert config_from_file(EXAMPLE).slo.ttft_slo_s is None


# Every flag of the router before issue 36 (then one field each of a flat RouterConfig), and each
# one added since, with a non-default value: it must still parse, from the flag and from the
# environment, to the option of the same name (and the aliases to theirs).
OLD_FLAGS: list[tuple[str, list[str], str, Any]] = [
    ("--host", ["0.0.0.0"], "listen.host", "0.0.0.0"),
    ("--port", ["9"], "listen.port", 9),
    ("--metrics-port", ["9101"], "listen.metrics_port", 9101),
    ("--ttft-probe-every", ["100"], "slo.ttft_probe_every", 100),
    ("--workers", ["http://h:1", "http://h:2"], "health.workers", ("http://h:1", "http://h:2")),
    ("--worker-urls", ["http://h:1"], "health.workers", ("http://h:1",)),
    ("--index-url", ["h:5"], "index.url", "h:5"),
    ("--index", ["h:5"], "index.url", "h:5"),
    ("--index-snapshot", ["/s"], "index.snapshot", "/s"),
    ("--index-snapshot-interval-s", ["5"], "index.snapshot_interval_s", 5.0),
    ("--policy", ["least_load"], "policy.name", "least_load"),
    ("--policy-options", ["fetch_ratio=1.5", "min_fetch_pages=3"], "policy.options",
     {"fetch_ratio": 1.5, "min_fetch_pages": 3}),
    ("--admin-token", ["t"], "admin.token", "t"),
    ("--log-level", ["debug"], "listen.log_level", "debug"),
    ("--model-path", ["/m"], "models.model_path", "/m"),
    ("--served-model-name", ["m"], "models.served_model_name", "m"),
    ("--model-version", ["v1"], "models.model_version", "v1"),
    ("--page-size", ["64"], "models.page_size", 64),
    ("--context-length", ["8192"], "models.context_length", 8192),
    ("--tenants-file", ["t.toml"], "keying.tenants_file", "t.toml"),
    ("--lora-paths", ["a=/x", "b=/y"], "keying.lora_paths", {"a": "/x", "b": "/y"}),
    ("--heartbeat-timeout-s", ["3"], "health.heartbeat_timeout_s", 3.0),
    ("--health-check-interval-s", ["1"], "health.health_check_interval_s", 1.0),
    ("--health-check-timeout-s", ["4"], "health.health_check_timeout_s", 4.0),
    ("--health-failures-to-remove", ["5"], "health.health_failures_to_remove", 5),
    ("--connect-timeouts-to-remove", ["5"], "health.connect_timeouts_to_remove", 5),
    ("--connect-refusals-to-remove", ["2"], "health.connect_refusals_to_remove", 2),
    ("--connect-timeout-s", ["1"], "proxy.connect_timeout_s", 1.0),
    ("--request-timeout-s", ["9"], "proxy.request_timeout_s", 9.0),
    ("--max-retries", ["0"], "proxy.max_retries", 0),
    ("--max-body-bytes", ["1024"], "client.max_body_bytes", 1024),
    ("--max-connections", ["8"], "proxy.max_connections", 8),
    ("--client-header-timeout-s", ["1"], "client.header_timeout_s", 1.0),
    ("--client-body-timeout-s", ["2"], "client.body_timeout_s", 2.0),
    ("--client-keep-alive-s", ["3"], "client.keep_alive_s", 3),
    ("--client-max-connections", ["9"], "client.max_connections", 9),
    ("--mismatch-min-requests", ["7"], "mismatch.min_requests", 7),
    ("--engine-queue-weight", ["0.75"], "cost.engine_queue_weight", 0.75),
    ("--kv-bytes-per-token", ["4096"], "cost.kv_bytes_per_token", 4096),
    ("--default-bandwidth-bytes-per-s", ["1e9"], "cost.default_bandwidth_Bps", 1e9),
    ("--remote-segment-bandwidth-bytes-per-s", ["2e9"], "cost.remote_segment_bandwidth_Bps",
     2e9),
    ("--transfer-overhead-s", ["0.01"], "cost.transfer_overhead_s", 0.01),
    ("--learn-from-inferred-prefill", [], "cost.learn_from_inferred_prefill", True),
    ("--drag-half-life", ["16"], "cost.drag_half_life", 16.0),
    ("--profile-max-tokens", ["0"], "profiling.max_tokens", 0),
    ("--profile-sizes", ["2"], "profiling.sizes", 2),
    ("--profiles-file", ["/p.json"], "profiling.file", "/p.json"),
    ("--ttft-slo-s", ["1.5"], "slo.ttft_slo_s", 1.5),
    ("--ttft-headroom", ["0.25"], "slo.ttft_headroom", 0.25),
    ("--min-retry-after-s", ["2"], "slo.min_retry_after_s", 2.0),
    ("--max-retry-after-s", ["9"], "slo.max_retry_after_s", 9.0),
    ("--pd-tbt-slo-s", ["0.05"], "slo.tbt_slo_s", 0.05),
    ("--dispatch", ["fifo"], "dispatch.order", "fifo"),
    ("--dispatch-depth", ["3"], "dispatch.depth", 3),
    ("--dispatch-max-hold-s", ["1"], "dispatch.max_hold_s", 1.0),
    ("--dispatch-timeout-s", ["9"], "dispatch.timeout_s", 9.0),
    ("--dispatch-max-held", ["10"], "dispatch.max_held", 10),
    ("--dispatch-max-held-bytes", ["1000"], "dispatch.max_held_bytes", 1000),
    ("--decode-tbt-base-s", ["0.03"], "decode.tbt_base_s", 0.03),
    ("--decode-tbt-per-request-s", ["0.001"], "decode.tbt_per_request_s", 0.001),
    ("--decode-default-output-tokens", ["64"], "decode.default_output_tokens", 64),
    ("--pd-mode", ["pool"], "pd.mode", "pool"),
    ("--pd-ratio", ["2:3"], "pd.ratio", "2:3"),
    ("--pd-pool-ready-timeout-s", ["3"], "pd.pool_ready_timeout_s", 3.0),
    ("--pd-pool-ready-poll-s", ["0.05"], "pd.pool_ready_poll_s", 0.05),
    ("--pd-decode-attempts", ["3"], "pd.decode_attempts", 3),
    ("--warm-interval-s", ["5"], "warm.interval_s", 5.0),
    ("--warm-min-hit-rate-per-s", ["0.5"], "warm.min_hit_rate", 0.5),
    ("--warm-min-pages", ["5"], "warm.min_pages", 5),
    ("--warm-max-replicas", ["2"], "warm.max_replicas", 2),
    ("--warm-busy-margin", ["3"], "warm.busy_margin", 3),
    ("--warm-rate-pages-per-s", ["8"], "warm.rate_pages_per_s", 8.0),
    ("--warm-burst-pages", ["32"], "warm.burst_pages", 32.0),
    ("--warm-cooldown-s", ["7"], "warm.cooldown_s", 7.0),
    ("--join-warm-pages", ["256"], "join_warm.pages", 256),
    ("--join-warm-timeout-s", ["9"], "join_warm.timeout_s", 9.0),
    ("--coordination-url", ["redis://127.0.0.1:6379/0"], "coordination.url",
     "redis://127.0.0.1:6379/0"),
    ("--coordination-cluster", ["c1"], "coordination.cluster", "c1"),
    ("--coordination-router-id", ["r1"], "coordination.router_id", "r1"),
    ("--coordination-load-publish-s", ["0.2"], "coordination.load_publish_s", 0.2),
    ("--coordination-unshared-load", [], "coordination.unshared_load", True),
    ("--coordination-resync-s", ["3"], "coordination.resync_s", 3.0),
    ("--coordination-lease-s", ["5"], "coordination.lease_s", 5.0),
    ("--coordination-op-timeout-s", ["1"], "coordination.op_timeout_s", 1.0),
    ("--engine-load-poll-s", ["2"], "engine_load.poll_s", 2.0),
    ("--engine-load-timeout-s", ["2"], "engine_load.timeout_s", 2.0),
    ("--engine-load-max-concurrency", ["4"], "engine_load.max_concurrency", 4),
    ("--topology-uplink-bytes-per-s", ["6.25e6"], "topology.uplink_Bps", 6.25e6),
    ("--topology-links", ["zone-a/rack-3=6.25e6"], "topology.links",
     {"zone-a/rack-3": 6.25e6}),
    ("--no-topology-learn", [], "topology.learn", False),
    ("--copies-interval-s", ["5"], "copies.interval_s", 5.0),
    ("--copies-domains", ["3"], "copies.domains", 3),
    ("--copies-min-hit-rate-per-s", ["1"], "copies.min_hit_rate", 1.0),
    ("--copies-min-pages", ["8"], "copies.min_pages", 8),
    ("--copies-max-pages", ["10"], "copies.max_pages", 10),
    ("--copies-max-share", ["0.1"], "copies.max_share", 0.1),
    ("--engine-load-stale-polls", ["5"], "engine_load.stale_polls", 5),
]


def test_the_old_flags_table_is_every_option():
    names = {flag[2:].removeprefix("no-").replace("-", "_")
             for flag, *_ in OLD_FLAGS} - {"worker_urls", "index"}
    assert names == set(OPTIONS)


@pytest.mark.parametrize("flag, args, path, want", OLD_FLAGS, ids=[f[0] for f in OLD_FLAGS])
def test_every_old_flag_still_parses_to_the_same_option(flag, args, path, want):
    section, field = path.split(".")
    cfg = config_from_args([flag, *args], environ={})
    got = getattr(getattr(cfg, section), field)
    assert got == want and got != getattr(getattr(RouterConfig(), section), field)
    o = next(o for o in options() if (o.section, o.field) == (section, field))
    assert cfg == RouterConfig.from_options(**{o.name: want})
    if o.name == flag[2:].replace("-", "_"):  # the same option from the environment
        text = " ".join(args) or "1"
        assert config_from_args([], environ={ENV_PREFIX + o.name.upper(): text}) == cfg


def test_ttft_slo_from_the_command_line_reaches_the_conductor():
    cfg = config_from_args(["--ttft-slo-s", "1.5", "--ttft-headroom", "0.2"], environ={})
    state = RouterState(cfg)
    assert state.routing.policy.slo.ttft_slo_s == 1.5  # type: ignore[attr-defined]
    assert state.routing.policy.slo is state.routing.slo is cfg.slo  # type: ignore[attr-defined]


def test_one_config_reaches_every_part():
    """No islands, no copies: the live router's parts run on the config's own sections."""
    cfg = RouterConfig.from_options(
        policy="conductor", engine_queue_weight=0.25, kv_bytes_per_token=4096,
        default_bandwidth_bytes_per_s=1e9, transfer_overhead_s=0.01,
        learn_from_inferred_prefill=True, ttft_slo_s=3.0, pd_tbt_slo_s=0.2, max_retry_after_s=9.0,
        decode_tbt_base_s=0.03, decode_default_output_tokens=64, warm_min_pages=5,
        warm_cooldown_s=7.0, pd_mode="pool", pd_ratio="1:2", pd_decode_attempts=3,
        pd_pool_ready_poll_s=0.05, drag_half_life=16.0, dispatch="fifo", dispatch_depth=3,
        dispatch_max_hold_s=2.0, dispatch_timeout_s=9.0, join_warm_pages=8,
        connect_timeout_s=2.0, heartbeat_timeout_s=7.0, model_path="/m")
    state = RouterState(cfg)
    assert state.routing.cost.config is cfg.cost
    assert state.routing.cost.config.kv_bytes_per_token == 4096
    assert state.routing.slo is cfg.slo
    assert state.routing.policy.slo is state.routing.slo  # type: ignore[attr-defined]
    assert state.routing.decode.config is cfg.decode
    assert state.warmer.planner.config is cfg.warm and state.warmer.join_pages == 8
    assert state.pd_pool is not None and state.pd_pool.orch.config is cfg.pd
    assert state.pd_pool.orch.config.decode_attempts == 3
    assert state.pd_util.config is cfg.pd
    assert state.health.config is cfg.health and state.health.models is cfg.models
    assert state.proxy.config is cfg.proxy
    gate = state.routing.gate
    assert gate is not None and gate.depth == 3 and gate.order.name == "fifo"
    assert state.dispatcher is not None and state.dispatcher.config is cfg.dispatch


def test_learn_from_inferred_prefill_has_one_default():
    assert RouterConfig().cost == CostConfig()
    assert "heartbeat_interval_s" not in OPTIONS  # dead (the router never sent heartbeats)


@pytest.mark.parametrize("argv, env, match", [
    (["--bogus"], {}, "unrecognized arguments: --bogus"),
    (["--port", "x"], {}, "port must be an integer, got 'x'"),
    (["--port", "70000"], {}, "port must be an integer in [0, 65535], got 70000"),
    (["--port", "9000", "--metrics-port", "9000"], {}, "metrics_port must differ from port"),
    (["--dispatch-depth", "0"], {}, "dispatch_depth must be an integer >= 1, got 0"),
    (["--dispatch", "lifo"], {}, "dispatch must be one of off, fifo, shortest_first, "
                                 "highest_ratio, got 'lifo'"),
    (["--config", "/nonexistent/r.toml"], {}, "cannot read config file"),
    (["--policy-options", "fetch_ratoi=2"], {}, "valid options: fetch_ratio, "),
    (["--policy-options", "fetch_ratio=fast"], {}, "fetch_ratio must be float"),
    (["--policy-options", "fetch_ratio"], {}, "policy_options: 'fetch_ratio' is not KEY=VALUE"),
    (["--policy", "fastest"], {}, "policy must be one of random, round_robin"),
    (["--policy-options", "ttft_slo_s=2"], {}, "router option, not a policy option"),
    (["--lora-paths", "nopath"], {}, "lora_paths: 'nopath' is not NAME=PATH"),
    ([], {"RADIX_GLOBAL_TTFT_HEADROOM": "1.5"}, "ttft_headroom must be a number in [0, 1)"),
    ([], {"RADIX_GLOBAL_LEARN_FROM_INFERRED_PREFILL": "maybe"}, "must be one of 1/0"),
    (["--log-level", "loud"], {}, "log_level must be one of debug, info"),
    (["--drag-half-life", "-1"], {}, "drag_half_life must be a number >= 0"),
    (["--ttft-slo-s", "-1"], {}, "ttft_slo_s must be a number or unset > 0, got -1.0"),
    (["--pd-ratio", "1"], {}, "pd_ratio must look like 'P:D'"),
    (["--pd-ratio", "0:2"], {}, "at least one worker of each role"),
    (["--min-retry-after-s", "9", "--max-retry-after-s", "2"], {}, "min_retry_after_s <="),
    (["--index", "h:1", "--index-snapshot", "/s"], {}, "index_snapshot is for the embedded"),
])
def test_a_bad_option_is_one_line_and_exit_2(argv, env, match, capsys, monkeypatch):
    for key, text in env.items():
        monkeypatch.setenv(key, text)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and match in err, err
    assert err.startswith("radix-global router: ")


def test_log_level_in_any_case():
    assert config_from_args(["--log-level", "WARNING"], environ={}).listen.log_level == "warning"


@pytest.mark.parametrize("text, match", [
    ("nope = 1\n", "unknown router option 'nope'"),
    ('port = "x"\n', "port must be an integer, got 'x'"),
    ("port = true\n", "port must be an integer in [0, 65535], got True"),
    ("workers = 3\n", "workers must be a list, got 3"),
    ("port = [\n", "cannot parse"),
])
def test_bad_config_is_refused(tmp_path, text, match, capsys):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(match)):
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
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert radix_global_cli.package_version() == pyproject["project"]["version"]


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RouterConfig().listen.port = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        RouterConfig().dispatch = None  # type: ignore[misc,assignment]


# --- what the user reads: --help, the example file, the docs -------------------------------------

def test_the_committed_example_is_the_generated_one(capsys):
    """``docs/examples/router.toml`` is ``radix-global router --print-example-config``
    (regenerate it with that command)."""
    assert EXAMPLE.read_text() == example_config()
    assert main(["--print-example-config"]) == 0
    assert capsys.readouterr().out == example_config()


def test_help_and_example_say_the_same():
    helptext = "".join(build_parser().format_help().split())  # argparse wraps at hyphens too
    example = example_config()
    keys = set(re.findall(r"^(?:# )?(\w+) = ", example, re.M))
    assert keys == set(OPTIONS)
    for o in options():
        assert o.flag in helptext and "".join(o.help.split()) in helptext, o.name
        assert f"env{ENV_PREFIX}{o.name.upper()}" in helptext
        assert f"# {o.help}" in example
        if o.bounds():
            assert "".join(o.bounds().split()) in helptext, o.name
            assert f"({o.bounds()})" in example, o.name


def test_the_example_file_is_a_valid_config_of_the_defaults():
    assert config_from_file(EXAMPLE) == RouterConfig()
    assert tomllib.loads(EXAMPLE.read_text())["policy"] == PolicyConfig().name
    assert "# admin_token = " in EXAMPLE.read_text()  # a secret is never filled in


def _documented_router_flags(text: str) -> set[str]:
    """Flags the text gives the router: inside a ``radix-global router ...`` code span, or a
    flag in a code span right after "router" / "router's" (``the router's `--x```)."""
    flags: set[str] = set()
    for span in re.findall(r"`radix-global router([^`]*)`", text):
        flags |= set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", span))
    flags |= set(re.findall(r"[Rr]outer(?:'s)?(?:,? set)? `(--[a-z][a-z0-9-]*)", text))
    return flags


def test_the_docs_name_only_options_that_exist():
    flags = {s for a in build_parser()._actions for s in a.option_strings}
    for doc in (ROOT / "README.md", ROOT / "docs" / "deploy.md"):
        named = _documented_router_flags(doc.read_text())
        assert named - flags == set(), f"{doc.name} names router flags that do not exist"
        env = set(re.findall(r"\bRADIX_GLOBAL_([A-Z0-9_]+)", doc.read_text()))
        router_env = {n for n in env if not n.startswith(("INDEX_", "WORKER_"))}
        assert router_env <= {o.name.upper() for o in options()}, doc.name
    assert {"--workers", "--index", "--profiles-file", "--heartbeat-timeout-s"} <= (
        _documented_router_flags((ROOT / "README.md").read_text())
        | _documented_router_flags((ROOT / "docs" / "deploy.md").read_text()))
    # Negative control: a flag that is gone is noticed.
    assert _documented_router_flags("`radix-global router --heartbeat-interval 5`") - flags == {
        "--heartbeat-interval"}


def test_a_policy_from_the_config_builds():
    cfg = RouterConfig.from_options(policy="conductor", policy_options={"fetch_ratio": 1.25},
                                    ttft_slo_s=2.0)
    policy = get_policy(cfg.policy.name, cfg.slo, **cfg.policy.options)
    assert policy.slo.ttft_slo_s == 2.0  # type: ignore[attr-defined]
