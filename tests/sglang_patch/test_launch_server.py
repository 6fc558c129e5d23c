"""The launch wrapper's supervisor loop (``sglang_patch/launch_server.py``): starting SGLang again
on new event ports when one it picked was taken before the engine bound it. The engine is a
stand-in process; everything else (the plan, the port check) is real."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from sglang_patch import launch_server
from sglang_patch.launch_plan import LaunchError, LaunchPlan
from sglang_patch.ports import endpoint_taken, free_port

ARGV = ["--model-path", "/m", "--port", str(free_port()), "--device", "cpu", "--page-size", "4",
        "--radix-global", "http://127.0.0.1:9"]


class Ready(Exception):
    """The stand-in engine got as far as being ready: the test stops the wrapper there."""


def test_endpoint_taken_sees_a_bound_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        assert endpoint_taken(endpoint)
    assert not endpoint_taken(endpoint)


def run_with(monkeypatch: pytest.MonkeyPatch, argv: list[str], hold_first_port: bool
             ) -> tuple[list[LaunchPlan], BaseException | int]:
    """``launch_server.run`` where the first engine exits at once (while another process holds
    its KV-event port, when ``hold_first_port``) and the next one is ready: the plans it
    started, and how ``run`` ended (its exception, or its exit code)."""
    started: list[LaunchPlan] = []
    held: list[socket.socket] = []

    def start(plan: LaunchPlan) -> subprocess.Popen[bytes]:
        started.append(plan)
        if len(started) == 1 and hold_first_port:
            assert plan.kv_events_endpoint is not None
            s = socket.socket()
            s.bind(("127.0.0.1", int(plan.kv_events_endpoint.rpartition(":")[2])))
            held.append(s)
        code = "import sys; sys.exit(1)" if len(started) == 1 else "pass"
        return subprocess.Popen([sys.executable, "-c", code])

    def wait_ready(proc: subprocess.Popen[bytes], base: str, timeout_s: float) -> dict:
        if proc.wait() != 0:
            raise LaunchError(f"SGLang exited with code {proc.returncode} before it was ready")
        raise Ready

    monkeypatch.setattr(launch_server, "_start", start)
    monkeypatch.setattr(launch_server, "wait_ready", wait_ready)
    try:
        outcome: BaseException | int = launch_server.run(argv)
    except (Ready, LaunchError) as exc:
        outcome = exc
    finally:
        for s in held:
            s.close()
    return started, outcome


def test_a_port_taken_before_the_engine_bound_it_starts_it_again_on_new_ports(monkeypatch):
    started, outcome = run_with(monkeypatch, ARGV, hold_first_port=True)
    assert isinstance(outcome, Ready), outcome
    assert len(started) == 2
    assert started[0].kv_events_endpoint != started[1].kv_events_endpoint
    assert started[0].port == started[1].port  # the operator's --port stays


def test_an_engine_that_fails_for_another_reason_is_not_started_again(monkeypatch):
    """Negative control: the same exit with every picked port free is the engine's own error."""
    started, outcome = run_with(monkeypatch, ARGV, hold_first_port=False)
    assert isinstance(outcome, LaunchError) and len(started) == 1


def test_the_operators_event_ports_are_never_changed(monkeypatch):
    base = free_port()
    started, outcome = run_with(monkeypatch, [*ARGV, "--radix-global-event-port-base", str(base)],
                                hold_first_port=True)
    assert isinstance(outcome, LaunchError) and len(started) == 1
