"""LocalCluster stops what it started when its process is told to stop (SIGTERM), and its stock
engines publish KV events our router can hear."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from radix_global_tools.cluster.local import EngineSet, engine_argv
from router.cluster.discovery import ModelOverrides, info_from_server_info

REPO = Path(__file__).resolve().parents[3]

# Starts one long-lived child through the cluster, prints its pid, then waits to be stopped.
_OWNER = """
import sys, time
from radix_global_tools.cluster.local import LocalCluster
with LocalCluster(sys.argv[1], stop_timeout_s=5) as cluster:
    child = cluster._spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"],
                           "http://127.0.0.1:9")
    print(child.popen.pid, flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_sigterm_stops_the_clusters_processes(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    child = int(owner.stdout.readline())
    try:
        assert _alive(child)
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the cluster's child outlived its owner"
    finally:
        owner.kill()
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_stock_engines_kv_events_reach_the_router() -> None:
    """The stock engine's ``--kv-events-config`` is one our router subscribes to: SGLang binds a
    loopback publisher only when told to, and a connecting publisher is not subscribed to
    (``router/cluster/discovery.py``). Without ``"bind": true`` every stock-engine benchmark ran
    behind an index that never heard an event."""
    argv = engine_argv(EngineSet("stock", "/models/tiny"), 30001, 0, None, None)
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    server = {"kv_events_config": json.dumps(config)}
    info, _, _ = info_from_server_info("http://127.0.0.1:30001", server, ModelOverrides())
    assert info.kv_events_endpoint == config["endpoint"]


def test_our_engines_wait_for_prefetches_unless_the_engine_set_chose_a_policy() -> None:
    """The harness's ``wait_complete`` is a default: an engine set naming its own prefetch policy
    (the economics check's ``timeout``, ``tests/multihost/test_mooncake_pool_e2e.py``) gets
    exactly that one, not two flags of which argparse would keep the harness's."""
    def policies(extra: tuple[str, ...]) -> list[str]:
        argv = engine_argv(EngineSet("ours", "/models/tiny", extra_args=extra), 30001, 0,
                           "http://127.0.0.1:8000", "shm-x")
        flag = "--hicache-storage-prefetch-policy"
        return [argv[i + 1] if a == flag else a.split("=", 1)[1]
                for i, a in enumerate(argv) if a.split("=", 1)[0] == flag]

    assert policies(()) == ["wait_complete"]
    assert policies(("--hicache-storage-prefetch-policy", "timeout")) == ["timeout"]
    assert policies(("--hicache-storage-prefetch-policy=timeout",)) == ["timeout"]
