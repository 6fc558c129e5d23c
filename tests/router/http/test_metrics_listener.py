"""``--metrics-port``: ``/metrics`` on a listener of its own, not on the client port; a stop
signal ends both listeners (a real ``radix-global router`` process)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from sglang_patch.ports import free_port

REPO = Path(__file__).resolve().parents[3]


def test_metrics_on_their_own_port_and_both_listeners_stop_together(tmp_path):
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "radix_global_cli", "router", "--host", "127.0.0.1",
            "--port", str(port), "--metrics-port", str(metrics_port), "--log-level", "warning"]
    with open(tmp_path / "router.log", "wb") as log:
        router = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # waits, not bounds: CI is shared
            try:
                scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except httpx.TransportError:
                assert router.poll() is None, (tmp_path / "router.log").read_text()
                assert time.monotonic() < deadline, "the router never listened"
                time.sleep(0.2)
        assert scrape.status_code == 200 and "radix_global_prompt_tokens" in scrape.text
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 404
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/health", timeout=5).status_code == 404
        router.send_signal(signal.SIGTERM)
        router.wait(timeout=30)
        for p in (port, metrics_port):
            try:
                httpx.get(f"http://127.0.0.1:{p}/", timeout=2)
                raise AssertionError(f"port {p} still answers after the router stopped")
            except httpx.TransportError:
                pass
    finally:
        if router.poll() is None:
            router.kill()
            router.wait()
