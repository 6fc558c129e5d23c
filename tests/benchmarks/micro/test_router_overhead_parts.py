"""The router-overhead benchmark's own parts on loopback: the instant upstream answers, the
http-floor forwards to it unchanged and the lean client times every answer; a floor whose
upstream is gone answers 500 (the benchmark's readiness check refuses it)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from benchmarks.harness.lean_client import run_batch
from benchmarks.micro.router_overhead import spawn, stop, wait_ready
from sglang_patch.ports import free_port


def test_floor_forwards_to_the_instant_upstream(tmp_path: Path) -> None:
    up_port, floor_port = free_port(), free_port()
    up, floor = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{floor_port}"
    procs = [spawn([sys.executable, "-m", "benchmarks.harness.instant_upstream", "--port",
                    str(up_port), "--model-path", str(tmp_path)], tmp_path / "up.log")]
    try:
        wait_ready(f"{up}/generate", {"input_ids": [1]}, timeout=60)
        procs.append(spawn([sys.executable, "-m", "benchmarks.harness.router_floor", "--upstream",
                            up, "--port", str(floor_port)], tmp_path / "floor.log"))
        body = {"input_ids": list(range(64)), "sampling_params": {"max_new_tokens": 1}}
        wait_ready(f"{floor}/generate", body, timeout=60)
        lat = asyncio.run(run_batch(floor, "/generate", body, 4, 40))
        assert len(lat) == 40 and all(t > 0 for t in lat)
        # Negative control: a floor whose upstream is gone answers 500, and the client says so.
        dead_port = free_port()
        procs.append(spawn([sys.executable, "-m", "benchmarks.harness.router_floor", "--upstream",
                            f"http://127.0.0.1:{free_port()}", "--port", str(dead_port)],
                           tmp_path / "dead.log"))
        with pytest.raises(RuntimeError, match="not ready: 500"):
            wait_ready(f"http://127.0.0.1:{dead_port}/generate", body, timeout=15)
    finally:
        for proc in reversed(procs):
            stop(proc)
