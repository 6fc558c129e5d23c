"""The wheel as an operator installs it (issue 37).

One module-scoped build of the wheel from a copy of the source tree, then:

- its contents: the five product packages (``py.typed`` in each, the CPU engine's
  ``child_site``, the simulator's calibrations), the licence, the version of ``pyproject.toml``;
  no ``benchmarks`` or ``tests``;
- ``[router]`` into a clean venv with ``constraints/lock-main.txt`` as constraints: ``pip check``,
  an import walk of every module of ``radix_global``, ``router`` and ``radix_global_cli`` (the
  venv holds only the core and ``[router]`` dependencies), ``radix-global router`` serving
  ``/health`` and a routed ``/generate`` in front of an instant upstream, the benchmark command
  saying it needs the source checkout;
- ``[tools]`` into another clean venv the same way: ``pip check``, an import walk of every module
  of ``radix_global_tools``, and ``replay``, ``cluster``, ``simulate`` and ``plan`` answering
  ``--help``;
- ``[mooncake]`` into a clean venv: ``pip check``, the store client and our pool import, the
  master's command is there;
- the core alone at the lowest declared ``grpcio``/``protobuf``: the generated gRPC code imports,
  and so does every module of ``radix_global`` and ``radix_global_cli``;
- ``[sglang]`` (a CUDA host's install) resolves: ``pip install --dry-run`` only.

It needs the package index (PyPI, or the one pip is configured with) and fails, naming it, when
the index cannot be reached: nothing here is skipped. A few minutes (pip's cache makes reruns
faster); it runs in the end-to-end phase.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from stdlib_upstream import Upstream, free_port, http_call

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "constraints" / "lock-main.txt"
PRODUCT = ("radix_global", "radix_global_cli", "radix_global_tools", "router", "sglang_patch")
# What the build reads, plus benchmarks/ and tests/ so that leaving them out is tested for real.
SOURCE = ("pyproject.toml", "README.md", "LICENSE", *PRODUCT, "benchmarks", "tests")
INSTALL_TIMEOUT_S = 900
SOURCE_ONLY_COMMANDS = ("bench",)
TOOL_COMMANDS = ("replay", "cluster", "simulate", "plan")


def _project() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["project"])


def _lowest(requirement_prefix: str) -> str:
    """The lower bound ``>=X`` of the core dependency named ``requirement_prefix``."""
    for req in _project()["dependencies"]:
        found = re.fullmatch(rf"{re.escape(requirement_prefix)}>=([^,]+)(,.*)?", req)
        if found:
            return found.group(1)
    raise AssertionError(f"no lower bound for {requirement_prefix} in pyproject.toml")


def _clean_env() -> dict[str, str]:
    """The environment of the installed venvs: nothing of this checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(argv: list[str], *, cwd: Path, timeout: float = INSTALL_TIMEOUT_S,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    shown = " ".join(a if len(a) < 200 else "<script>" for a in argv)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    took = time.monotonic() - started
    print(f"[{took:6.1f} s] rc={done.returncode} {shown}")
    if check and done.returncode != 0:
        noise = "WARNING: Location"  # this machine's pip config names index folders it lacks
        err = "\n".join(line for line in done.stderr.splitlines() if not line.startswith(noise))
        raise AssertionError(f"{shown} exited {done.returncode}:\n"
                             f"{done.stdout[-3000:]}\n{err[-6000:]}")
    return done


def _index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/") + "/"


@pytest.fixture(scope="module")
def index_reachable() -> None:
    url = _index_url() + "pip/"
    try:
        with urllib.request.urlopen(url, timeout=20) as answer:
            answer.read(1)
    except (urllib.error.URLError, OSError) as exc:
        pytest.fail(f"tests/packaging needs the package index to install the wheel into clean "
                    f"venvs, and {url} cannot be reached: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("packaging")


@pytest.fixture(scope="module")
def wheel(work: Path, index_reachable: None) -> Path:
    """The wheel, built from a copy of the source tree (no build/ or egg-info in the checkout;
    the build backend comes from the index)."""
    src = work / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "results")
    for name in SOURCE:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=skip)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    out = work / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
         cwd=work)
    (found,) = out.glob("radix_global-*.whl")
    return found


def _venv(path: Path) -> Path:
    _run([sys.executable, "-m", "venv", str(path)], cwd=path.parent, timeout=120)
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def router_venv(work: Path, wheel: Path, index_reachable: None) -> Path:
    """A clean venv holding the wheel with ``[router]``, the lock as constraints."""
    py = _venv(work / "venv-router")
    _run([str(py), "-m", "pip", "install", "-q", "-c", str(LOCK), f"{wheel}[router]"], cwd=work)
    return py


@pytest.fixture(scope="module")
def tools_venv(work: Path, wheel: Path, index_reachable: None) -> Path:
    """A clean venv holding the wheel with ``[tools]`` (which brings ``[router]``), the lock as
    constraints."""
    py = _venv(work / "venv-tools")
    _run([str(py), "-m", "pip", "install", "-q", "-c", str(LOCK), f"{wheel}[tools]"], cwd=work)
    return py


@pytest.fixture(scope="module")
def mooncake_venv(work: Path, wheel: Path, index_reachable: None) -> Path:
    """A clean venv holding the wheel with ``[mooncake]`` (the CPU/TCP Mooncake Store client and
    master), the lock as constraints."""
    py = _venv(work / "venv-mooncake")
    _run([str(py), "-m", "pip", "install", "-q", "-c", str(LOCK), f"{wheel}[mooncake]"],
         cwd=work)
    return py


@pytest.fixture(scope="module")
def lowest_grpc_venv(work: Path, wheel: Path, index_reachable: None) -> Path:
    """A clean venv holding the wheel's core only, at the lowest declared grpcio and protobuf."""
    py = _venv(work / "venv-lowest")
    _run([str(py), "-m", "pip", "install", "-q", str(wheel), f"grpcio=={_lowest('grpcio')}",
          f"protobuf=={_lowest('protobuf')}"], cwd=work)
    return py


WALK = r"""
import importlib, json, pkgutil, sys, traceback
seen, failed, where = [], {}, {}
for top in sys.argv[1:]:
    package = importlib.import_module(top)
    where[top] = package.__file__
    for info in pkgutil.walk_packages(package.__path__, top + ".",
                                      onerror=lambda name: failed.setdefault(name, "walk")):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # runs the command
        seen.append(info.name)
        try:
            importlib.import_module(info.name)
        except BaseException:
            failed[info.name] = traceback.format_exc(limit=2)
print(json.dumps({"seen": seen, "failed": failed, "where": where}))
"""


def _import_walk(py: Path, cwd: Path, *packages: str) -> dict[str, Any]:
    done = _run([str(py), "-c", WALK, *packages], cwd=cwd, timeout=300)
    walked: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    for top, file in walked["where"].items():  # imported from the venv, never the checkout
        assert Path(file).is_relative_to(py.parent.parent), (top, file)
    return walked


def test_wheel_contents(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    version = _project()["version"]
    dist_info = f"radix_global-{version}.dist-info"
    tops = {n.split("/")[0] for n in names}
    print(f"{wheel.name}: {len(names)} files, top level {sorted(tops)}")
    assert tops == {*PRODUCT, dist_info}, tops  # no benchmarks, no tests
    for package in PRODUCT:
        assert f"{package}/py.typed" in names
    assert "sglang_patch/child_site/sitecustomize.py" in names  # the CPU engine's patch hook
    for calibration in ("paper_config.toml", "cpu_config.toml"):  # radix-global simulate's
        assert f"radix_global_tools/simulate/{calibration}" in names
    assert "radix_global_tools/plan/default_costs.toml" in names  # radix-global plan's weights
    assert "radix_global/proto/index_pb2_grpc.py" in names
    assert f"{dist_info}/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    assert f"\nVersion: {version}\n" in metadata
    assert "License-Expression: Apache-2.0" in metadata


def test_router_install_pip_check(router_venv: Path, work: Path) -> None:
    done = _run([str(router_venv), "-m", "pip", "check"], cwd=work, timeout=120)
    print(done.stdout)
    assert "No broken requirements found" in done.stdout


def test_router_install_imports_every_module(router_venv: Path, work: Path) -> None:
    walked = _import_walk(router_venv, work, "radix_global", "router", "radix_global_cli")
    print(f"{len(walked['seen'])} modules imported")
    assert not walked["failed"], json.dumps(walked["failed"], indent=1)
    assert len(walked["seen"]) > 80
    # Nothing of the engine side came with [router].
    for absent in ("torch", "sglang"):
        done = _run([str(router_venv), "-c", f"import {absent}"], cwd=work, check=False)
        assert done.returncode != 0, f"{absent} is installed with [router]"


def test_version_in_one_place(router_venv: Path, work: Path) -> None:
    bin_dir = router_venv.parent
    done = _run([str(bin_dir / "radix-global"), "--version"], cwd=work, timeout=60)
    assert done.stdout.strip() == f"radix-global {_project()['version']}"


@pytest.mark.parametrize("command", SOURCE_ONLY_COMMANDS)
def test_benchmark_commands_need_the_checkout(router_venv: Path, work: Path,
                                              command: str) -> None:
    done = _run([str(router_venv.parent / "radix-global"), command, "--help"], cwd=work,
                timeout=60, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == (f"radix-global {command}: needs the source checkout "
                                   "(benchmarks/ is not in the wheel)")


def test_tools_install_pip_check(tools_venv: Path, work: Path) -> None:
    done = _run([str(tools_venv), "-m", "pip", "check"], cwd=work, timeout=120)
    print(done.stdout)
    assert "No broken requirements found" in done.stdout


def test_tools_install_imports_every_module(tools_venv: Path, work: Path) -> None:
    walked = _import_walk(tools_venv, work, "radix_global_tools")
    print(f"{len(walked['seen'])} modules imported")
    assert not walked["failed"], json.dumps(walked["failed"], indent=1)
    assert len(walked["seen"]) > 15


def test_mooncake_install_pip_check_and_the_pool_imports(mooncake_venv: Path,
                                                         work: Path) -> None:
    """``[mooncake]`` resolves and brings the store client our pool drives and its master (the
    master serving, and the pool across hosts, are the Mooncake end-to-end tests': its
    listeners bind every interface, so they run only inside test hosts)."""
    done = _run([str(mooncake_venv), "-m", "pip", "check"], cwd=work, timeout=120)
    assert "No broken requirements found" in done.stdout
    probe = "import mooncake.store, sglang_patch.pool.mooncake_pool as p; print(p.__file__)"
    done = _run([str(mooncake_venv), "-c", probe], cwd=work, timeout=120)
    module = done.stdout.split()[-1]
    assert Path(module).is_relative_to(mooncake_venv.parent.parent), module
    assert (mooncake_venv.parent / "mooncake_master").is_file()


@pytest.mark.parametrize("command", TOOL_COMMANDS)
def test_tool_commands_run_from_the_wheel(tools_venv: Path, work: Path, command: str) -> None:
    done = _run([str(tools_venv.parent / "radix-global"), command, "--help"], cwd=work,
                timeout=60, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "usage:" in done.stdout


@pytest.fixture
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(timeout=10)


def test_router_serves_from_the_wheel(router_venv: Path, work: Path, upstream: str) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (work / "router.log").open("w+")
    proc = subprocess.Popen([str(router_venv.parent / "radix-global"), "router", "--host",
                             "127.0.0.1", "--port", str(port), "--workers", upstream],
                            cwd=work, env=_clean_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        health = generate = (0, b"")
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = http_call("GET", f"{base}/health")
                if health[0] == 200:
                    generate = http_call("POST", f"{base}/generate",
                                     {"text": "hello world", "rid": "packaging-1",
                                      "sampling_params": {"max_new_tokens": 2}})
                    if generate[0] == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        log.seek(0)
        tail = log.read()[-4000:]
        assert health[0] == 200, f"/health {health}; router log:\n{tail}"
        assert generate[0] == 200, f"/generate {generate}; router log:\n{tail}"
        assert json.loads(generate[1])["text"] == "hello from upstream"
        assert any(b.get("text") == "hello world" for b in Upstream.generated)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_lowest_grpc_bounds_import_the_generated_code(lowest_grpc_venv: Path,
                                                      work: Path) -> None:
    low_grpc, low_protobuf = _lowest("grpcio"), _lowest("protobuf")
    done = _run([str(lowest_grpc_venv), "-c",
                 "import grpc, google.protobuf, radix_global.proto.index_pb2_grpc, "
                 "radix_global.service, radix_global.client; "
                 "print(grpc.__version__, google.protobuf.__version__)"], cwd=work, timeout=120)
    assert done.stdout.split() == [low_grpc, low_protobuf]
    # The core alone (no extra) imports the whole index and the command.
    walked = _import_walk(lowest_grpc_venv, work, "radix_global", "radix_global_cli")
    print(f"{len(walked['seen'])} modules imported with the core alone")
    assert not walked["failed"], json.dumps(walked["failed"], indent=1)
    assert len(walked["seen"]) > 30


def test_sglang_extra_resolves(lowest_grpc_venv: Path, work: Path, wheel: Path) -> None:
    """What a CUDA host installs: resolution only (SGLang's kernels and CUDA torch are not for
    these machines), never --no-deps."""
    report = work / "sglang-dry-run.json"
    _run([str(lowest_grpc_venv), "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
          "--report", str(report), f"{wheel}[sglang]"], cwd=work)
    chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"]
              for item in json.loads(report.read_text())["install"]}
    print(f"[sglang] resolves to {len(chosen)} distributions: sglang {chosen.get('sglang')}, "
          f"torch {chosen.get('torch')}, numpy {chosen.get('numpy')}")
    assert chosen.get("sglang") == "0.5.23"
    assert "torch" in chosen
