"""tests/vllm_servers.py without the vLLM venv: a clear error naming ``make bootstrap-vllm``
(the e2e fixture turns it into a test failure, never a skip)."""

from __future__ import annotations

from pathlib import Path

import pytest
import vllm_servers


def test_missing_vllm_venv_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setattr(vllm_servers, "REPO_ROOT", tmp_path)
    with pytest.raises(vllm_servers.VllmMissingError, match="make bootstrap-vllm"):
        vllm_servers.vllm_python()
    with pytest.raises(vllm_servers.VllmMissingError), \
            vllm_servers.vllm_servers(tmp_path, [tmp_path / "kv0"], tmp_path):
        pass  # nothing is started


def test_vllm_argv_publishes_events_on_ipc_only(tmp_path: Path) -> None:
    argv = vllm_servers.vllm_argv("/m", 1234, tmp_path / "kv0")
    config = argv[argv.index("--kv-events-config") + 1]
    assert f'"endpoint": "ipc://{tmp_path}/kv0"' in config and "tcp://" not in config
    assert "--enable-prefix-caching" in argv and "--enable-prompt-tokens-details" in argv
