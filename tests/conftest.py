"""Shared fixtures: the tiny model and real SGLang servers on CPU (see ``tests/servers.py``).

Fixtures
- ``tiny_model_dir`` (session): the make-model folder (built once, cached across sessions).
- ``redis_server`` (function): a real Redis on a Unix socket (``tests/redis_server.py``).
- ``sglang_server_factory`` (function): ``start(extra_args=(), env=None, port=None, **kw)`` ->
  ``RunningServer``; every server started through it is stopped after the test, and when the
  test failed the tail of each server's log is printed.

Markers (declared in pyproject.toml): tests starting server processes carry ``e2e``; tests
needing sglang carry ``sglang``. Where the sglang distribution is not installed at all (the light
router install) ``sglang`` tests are skipped with that reason; everywhere else they run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from redis_server import RedisServer
from servers import RunningServer, sglang_server

# Timings on these shared machines are noisy: property tests check behaviour, never speed.
settings.register_profile("radix-global", deadline=None)
settings.load_profile("radix-global")

SGLANG_INSTALLED = importlib.util.find_spec("sglang") is not None


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test-unit``), each worker process hands out ports from its own
    slice of ``sglang_patch.ports.LATER_BIND_PORTS``: a port checked free by one worker and bound
    seconds later (a spawned interpreter's) is then never handed out by the other meanwhile."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return
    from sglang_patch import ports

    low, high = ports.LATER_BIND_PORTS
    size = (high - low + 1) // count
    start = low + int(worker[2:]) * size
    ports.LATER_BIND_PORTS = (start, start + size - 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SGLANG_INSTALLED:
        return
    skip = pytest.mark.skip(reason="sglang is not installed in this environment")
    for item in items:
        if "sglang" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sglang_patch.make_model import make_model

    return make_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture
def sglang_server_factory(
    request: pytest.FixtureRequest, tiny_model_dir: Path
) -> Iterator[Callable[..., RunningServer]]:
    started: list[RunningServer] = []
    with contextlib.ExitStack() as stack:

        def start(extra_args: tuple[str, ...] | list[str] = (), **kwargs: Any) -> RunningServer:
            model = kwargs.pop("model_path", tiny_model_dir)
            server = stack.enter_context(sglang_server(model, extra_args, **kwargs))
            started.append(server)
            return server

        try:
            yield start
        finally:
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.failed:
                for server in started:
                    print(f"\n===== {server.url} log {server.log_path} =====\n"
                          f"{server.log_tail()}")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real Redis (the coordination service of several routers) on a Unix socket of the
    test's own, no persistence; ``kill()`` / ``start()`` for outages."""
    server = RedisServer(tmp_path).start()
    yield server
    server.kill()
