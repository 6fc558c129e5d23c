"""Start and stop real vLLM CPU servers (OpenAI API, the ``.venv-vllm`` venv) for end-to-end tests.

    from vllm_servers import vllm_servers          # tests/ is on sys.path (tests/conftest.py)
    with vllm_servers(model_dir, [tmp / "kv0", tmp / "kv1"]) as (w0, w1):
        httpx.post(w0.url + "/v1/chat/completions", json={...})

Contract
- ``vllm_python()`` is ``<repo>/.venv-vllm/bin/python``; when it is missing it raises
  :class:`VllmMissingError` telling to run ``make bootstrap-vllm`` (a test calls ``pytest.fail``
  with it: a missing engine is a failure, never a skip).
- Each server runs ``python -m vllm.entrypoints.openai.api_server --model M --served-model-name
  tiny --enable-prefix-caching --enforce-eager --enable-prompt-tokens-details`` (so answers carry
  ``usage.prompt_tokens_details.cached_tokens``) with KV events published on
  ``ipc://<events_path>`` (never ``tcp://*``: vLLM would bind every interface). Environment:
  ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB; ~3 GB per server in all), ``PYTHONHASHSEED=0`` (vLLM seeds
  its block hashes from it), one OpenMP core per server (``VLLM_CPU_OMP_THREADS_BIND``: server
  ``i`` on core ``i mod ncpu``; vLLM's "auto" puts every server on core 0).
- Servers start together, in their own process groups, logging to ``<log_dir>/vllm<i>.log``;
  ready = ``GET /health`` 200. A server that exits or is not ready in ``startup_timeout`` raises
  :class:`servers.ServerStartError` with its log tail. On exit every group gets SIGTERM, then
  SIGKILL (``servers._stop``), and the semaphore files they left in /dev/shm are removed
  (``sglang_patch.sem_sweep``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from servers import REPO_ROOT, RunningServer, ServerStartError, _healthy, _stop, free_port

from sglang_patch.sem_sweep import semaphores, sweep_semaphores

BLOCK_SIZE = 128  # vLLM's CPU block size: the router's page size for these workers
SERVED_MODEL_NAME = "tiny"


class VllmMissingError(RuntimeError):
    """The vLLM CPU venv is not built."""


def _venv_python() -> Path:
    return REPO_ROOT / ".venv-vllm" / "bin" / "python"


def vllm_python() -> Path:
    python = _venv_python()
    if not python.exists():
        raise VllmMissingError(
            f"{python} not found: the vLLM CPU venv is missing; run `make bootstrap-vllm`")
    return python


def events_endpoint(events_path: str | os.PathLike[str]) -> str:
    return f"ipc://{Path(events_path).resolve()}"


def vllm_argv(model_path: str | os.PathLike[str], port: int, events_path: str | os.PathLike[str],
              extra_args: Sequence[str] = ()) -> list[str]:
    events = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": events_endpoint(events_path), "topic": "kv-events"}
    # checked by ``vllm_servers`` before it starts anything: a command line needs no venv
    return [str(_venv_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_path), "--served-model-name", SERVED_MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--enable-prefix-caching",
            "--enforce-eager", "--enable-prompt-tokens-details",
            "--kv-events-config", json.dumps(events), *extra_args]


def vllm_env(core: int, env: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONHASHSEED": "0",
            "VLLM_CPU_OMP_THREADS_BIND": str(core), **(env or {})}


@contextlib.contextmanager
def vllm_servers(
    model_path: str | os.PathLike[str],
    events_paths: Sequence[str | os.PathLike[str]],
    log_dir: str | os.PathLike[str],
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 420.0,
    stop_timeout: float = 15.0,
) -> Iterator[list[RunningServer]]:
    """One vLLM server per entry of ``events_paths``, all started at once; yields them ready."""
    vllm_python()  # fail before starting anything
    ncpu = os.cpu_count() or 1
    procs: list[subprocess.Popen[bytes]] = []
    running: list[RunningServer] = []
    sems = semaphores()
    try:
        for i, events_path in enumerate(events_paths):
            port = free_port()
            argv = vllm_argv(model_path, port, events_path, extra_args)
            log = Path(log_dir) / f"vllm{i}.log"
            with log.open("wb") as out:
                out.write(("$ " + " ".join(argv) + "\n").encode())
                out.flush()
                procs.append(subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=vllm_env(i % ncpu, env),
                    cwd=str(REPO_ROOT), start_new_session=True))
            running.append(RunningServer(f"http://127.0.0.1:{port}", port, procs[-1].pid, log,
                                         tuple(argv)))
        deadline = time.monotonic() + startup_timeout
        pending = list(zip(procs, running, strict=True))
        while pending:
            for proc, server in list(pending):
                if _healthy(server.url):
                    pending.remove((proc, server))
                elif proc.poll() is not None:
                    raise ServerStartError(
                        f"vLLM exited with {proc.returncode} during startup; log "
                        f"{server.log_path}:\n{server.log_tail()}", proc.pid, server.log_path)
            if pending and time.monotonic() > deadline:
                server = pending[0][1]
                raise ServerStartError(
                    f"vLLM not healthy after {startup_timeout:.0f} s; log {server.log_path}:\n"
                    f"{server.log_tail()}", server.pid, server.log_path)
            time.sleep(0.25)  # a start-up ends at any moment: poll often
        yield running
    finally:
        for proc in procs:
            _stop(proc, stop_timeout)
        sweep_semaphores(sems, groups=[proc.pid for proc in procs])
