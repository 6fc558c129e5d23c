"""`radix-global index serve` as a real process: serve, snapshot on SIGTERM, restore on restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from radix_global.client import IndexClient, NotAuthorizedError
from radix_global.keys import page_keys
from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.types import Location, Namespace, Tier, WorkerId

NS = Namespace("tiny@1")
ROOT = Path(__file__).resolve().parents[2]


def _start(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "radix_global_cli", "index", "serve", "--port", "0", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "serving on" in line:
            return proc, line.rsplit(" ", 1)[-1].strip()
        if not line and proc.poll() is not None:
            break
    _kill(proc)
    raise AssertionError(f"index service did not start: {proc.returncode}")


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    finally:
        _kill(proc)


@pytest.mark.e2e
def test_serve_snapshot_on_sigterm_and_restore(tmp_path: Path) -> None:
    snap = tmp_path / "index.snap"
    args = ("--snapshot", str(snap), "--admin-token", "tok", "--shards", "2")
    keys = page_keys(list(range(40)), 4)
    proc, target = _start(*args)
    try:
        with IndexClient(target, admin_token="tok") as client:
            client.register(WorkerInfo(worker_id="sgl-0", url="http://127.0.0.1:30000",
                                       model="tiny", namespace=NS, page_size=4))
            client.apply(StorePages(NS, Location(WorkerId("sgl-0"), 0, Tier.GPU), None, keys))
            before = client.match(NS, keys)
            assert before.best_pages == len(keys)
        with IndexClient(target) as anon, pytest.raises(NotAuthorizedError):
            anon.deregister(WorkerId("sgl-0"))
        assert _stop(proc) == 0
    finally:
        _kill(proc)
    assert snap.stat().st_size > 0
    proc, target = _start(*args)
    try:
        with IndexClient(target, admin_token="tok") as client:  # Match needs it too (issue 35)
            assert client.match(NS, keys) == before
            assert client.stats()["service"]["workers"] == 1
        assert _stop(proc) == 0
    finally:
        _kill(proc)
    snap.write_bytes(b"RGIXSNAP broken")
    bad = subprocess.run(
        [sys.executable, "-m", "radix_global_cli", "index", "serve", "--port", "0",
         "--snapshot", str(snap)], cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "cannot start" in bad.stderr and "truncated" in bad.stderr


# -- The options (docs/interfaces.md, "Options: one config source per process"): flags, environment,
# file, help, example TOML.

def _config(argv: list[str], environ: dict[str, str] | None = None):
    from radix_global.service import parser
    from radix_global.service_config import config_from

    return config_from(vars(parser().parse_args(["serve", *argv])), environ or {})


def test_defaults_are_the_commands_and_the_in_process_one_binds_any_port() -> None:
    from radix_global.service_config import ServiceConfig

    config = _config([])
    assert (config.host, config.port, config.shards, config.heartbeat_timeout_s) == (
        "127.0.0.1", 50051, 1, 20.0)
    assert config.log_level == "info" and config.admin_token is None
    assert ServiceConfig().port == 0


def test_sources_override_in_order_file_environment_flags(tmp_path: Path) -> None:
    toml = tmp_path / "index.toml"
    toml.write_text('[index]\nshards = 3\nheartbeat_timeout_s = 7\nadmin_token = "f"\n')
    yaml = tmp_path / "index.yaml"
    yaml.write_text("shards: 5\nsnapshot: /tmp/x.snap\nlog_level: DEBUG\n")
    assert _config(["--config", str(toml)]).shards == 3
    flat = _config(["--config", str(yaml)])
    assert (flat.shards, flat.snapshot_path, flat.log_level) == (5, "/tmp/x.snap", "debug")
    env = {"RADIX_GLOBAL_INDEX_SHARDS": "4", "RADIX_GLOBAL_ADMIN_TOKEN": "shared"}
    both = _config(["--config", str(toml)], env)
    assert (both.shards, both.heartbeat_timeout_s, both.admin_token) == (4, 7.0, "shared")
    own = _config([], {**env, "RADIX_GLOBAL_INDEX_ADMIN_TOKEN": "own"})
    assert own.admin_token == "own"  # the process's own variable wins over the shared one
    flags = _config(["--config", str(toml), "--shards", "2", "--admin-token", "t",
                     "--log-level", "Warning"], env)
    assert (flags.shards, flags.admin_token, flags.log_level) == (2, "t", "warning")


def test_old_spellings_work_with_a_deprecation_line(capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(["--heartbeat-timeout", "3", "--snapshot-interval", "9"])
    assert (config.heartbeat_timeout_s, config.snapshot_interval_s) == (3.0, 9.0)
    err = capsys.readouterr().err.splitlines()
    assert err == ["radix-global index: --heartbeat-timeout is deprecated; use "
                   "--heartbeat-timeout-s",
                   "radix-global index: --snapshot-interval is deprecated; use "
                   "--snapshot-interval-s"]
    assert _config(["--heartbeat-timeout-s", "4"]).heartbeat_timeout_s == 4.0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv, env, message", [
    (["--heartbeat-timeout-s", "0"], {}, "heartbeat_timeout_s must be a number > 0, got 0.0"),
    (["--shards", "0"], {}, "shards must be an integer >= 1, got 0"),
    (["--port", "70000"], {}, "port must be an integer in [0, 65535], got 70000"),
    (["--log-level", "loud"], {}, "log_level must be one of debug, info, warning, error"),
    ([], {"RADIX_GLOBAL_INDEX_SNAPSHOT_INTERVAL_S": "-1"}, "snapshot_interval_s must be"),
    (["--config", "/nonexistent/index.toml"], {}, "cannot read config file"),
])
def test_a_bad_value_is_one_line_and_exit_2(argv: list[str], env: dict[str, str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from radix_global.service import main

    assert main(["serve", *argv], env) == 2
    err = capsys.readouterr().err
    assert err.startswith("radix-global index: error: " + message), err
    assert err.count("\n") == 1


def test_an_unknown_key_in_the_file_is_refused(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from radix_global.service import main

    bad = tmp_path / "index.toml"
    bad.write_text("[index]\nheartbeat_timeout_ms = 5\n")
    assert main(["serve", "--config", str(bad)], {}) == 2
    assert "unknown index option 'heartbeat_timeout_ms'" in capsys.readouterr().err


def test_help_example_config_and_committed_file_agree(capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    from radix_global.options import build
    from radix_global.service import main, parser
    from radix_global.service_config import SECTIONS, ServeConfig, example_config, options

    assert main(["serve", "--print-example-config"]) == 0
    text = capsys.readouterr().out
    assert text == example_config()
    assert (ROOT / "docs/examples/index.toml").read_text() == text, \
        "regenerate: radix-global index serve --print-example-config > docs/examples/index.toml"
    assert build(SECTIONS[0], tomllib.loads(text)) == ServeConfig()
    serve = next(a for a in parser()._subparsers._group_actions[0].choices.values())  # type: ignore[union-attr]
    usage = " ".join(serve.format_help().split())
    for o in options():
        assert o.help and o.help in text, o.name  # every option has help, in the file
        assert o.flag in usage and f"env RADIX_GLOBAL_INDEX_{o.name.upper()}" in usage, o.name
        assert f"{o.name} = " in text, o.name
        assert o.hint is bool or o.bounds() or o.hint in (str, str | None), o.name  # bounds


@pytest.mark.e2e
def test_the_conductor_api_is_served_beside_grpc_with_the_services_token() -> None:
    """``--conductor-port``: Mooncake Conductor's indexer API on the service's host
    (docs/interfaces.md, "Mooncake Conductor's indexer API"), with the same token rule as the key
    queries."""
    import httpx

    proc, _ = _start("--conductor-port", "0", "--admin-token", "tok")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "conductor API on" in line, line
        base = "http://" + line.rsplit(" ", 1)[-1].strip()
        query = {"model": "tiny", "token_ids": list(range(16)), "block_size": 4}
        assert httpx.post(f"{base}/query", json=query).status_code == 401
        r = httpx.post(f"{base}/query", json=query, headers={"Authorization": "Bearer tok"})
        assert r.status_code == 200 and r.json() == {"default": {}}, r.text
    finally:
        assert _stop(proc) == 0
