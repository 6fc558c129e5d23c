"""SGLang's native PD (``--disaggregation-mode``, Mooncake TCP) on CPU, with and without our patch.

What the driver does (``docs/pd.md`` explains every step): inside a private network namespace
(Mooncake's TCP listeners bind all interfaces; ``unshare -n`` + ``ip link set lo up``), start a
prefill and a decode worker through our launch wrapper with ``--disaggregation-transfer-backend
mooncake_tcp`` and our router in front of them (``radix-global router --workers P D``: it learns
the roles and the bootstrap port from ``/server_info``), then send one greedy request to the
router, which sends it the way SGLang's router does in PD mode: the same body, with
``bootstrap_host`` / ``bootstrap_port`` / ``bootstrap_room``, to both workers at once
(``router/request/relay.py``, bodies from ``router/pd/protocol.py::native_body``). The reference
is HF transformers' greedy output for the same prompt (equal to SGLang's on CPU:
``tests/sglang_patch/test_sglang_server.py``).

- With ``sglang_patch.pd_cpu`` (the launch wrapper carries it into SGLang's processes): the decode
  worker's output equals the reference token for token.
- Stock SGLang 0.5.23 (torch 2.13 CPU, mooncake-transfer-engine-non-cuda 0.3.13.post1): the
  prefill scheduler dies on the first KV send: ``prefill.py:_send_kv_chunk`` allocates page
  indices with ``pin_memory=True`` because the Mooncake sender declares
  ``supports_host_tensor_indices``; a CPU-only torch has no pinned allocator. That test re-raises
  the exact ``RuntimeError`` read from the prefill worker's log and is a strict xfail: the day it
  works unpatched it XPASSes and the run fails, so the patch can be dropped. Any other failure
  (start-up, a different error) is an ordinary test failure.

The driver half (``python this_file.py --driver OUT MODEL WORKDIR patched|stock``) runs inside the
namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sglang_patch import cpu_compat
from sglang_patch.sem_sweep import semaphores, sweep_semaphores

BLOCKING_ERROR = ("RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; "
                  "no pinned memory allocator is available on this system.")
REPO = Path(__file__).resolve().parents[2]
PAGE = 4
CPU_FLAGS = [*cpu_compat.CPU_SERVER_FLAGS, "--dtype", "float32",
             "--max-total-tokens", "8192", "--page-size", str(PAGE)]


def _netns_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def _run_driver(model: Path, tmp_path: Path, patched: bool) -> dict[str, Any]:
    if not _netns_available():  # a hard requirement of the set-up, not the feature
        pytest.fail("needs `unshare -n` and `ip` (root or user namespaces) to isolate Mooncake")
    out = tmp_path / "result.json"
    cmd = (f"ip link set lo up && exec {sys.executable} {Path(__file__).resolve()} --driver "
           f"{out} {model} {tmp_path} {'patched' if patched else 'stock'}")
    # PYTHONPATH: the driver imports this project before its __main__ block runs.
    proc = subprocess.run(["unshare", "-n", "bash", "-c", cmd], cwd=str(REPO), timeout=1400,
                          capture_output=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.exists(), (f"driver exited {proc.returncode} without a result:\n"
                          f"{proc.stdout.decode()[-3000:]}\n{proc.stderr.decode()[-3000:]}")
    return dict(json.loads(out.read_text()))


@pytest.mark.e2e
@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_native_pd_on_cpu_with_patch_equals_reference(tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    """With ``sglang_patch.pd_cpu``: prefill + decode workers (launch wrapper, mooncake_tcp),
    one request with SGLang's bootstrap fields to both: the decode worker's greedy output equals
    a non-disaggregated run (HF transformers) token for token."""
    result = _run_driver(tiny_model_dir, tmp_path, patched=True)
    assert "startup_error" not in result, result
    assert result.get("decode_status") == 200, result
    assert result["output_ids"] == result["reference"], result
    # the prefill half answered too, for the whole prompt (a decode-mode worker cannot
    # compute a prompt: its KV came from the prefill worker through Mooncake)
    assert result["prefill_prompt_tokens"] == result["prompt_tokens"], result


@pytest.mark.e2e
@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.xfail(strict=True, raises=RuntimeError,
                   reason="stock SGLang 0.5.23 PD prefill pins host memory (prefill.py "
                          "_send_kv_chunk): no pinned allocator on CPU torch; see docs/pd.md")
def test_native_pd_on_cpu_stock_sglang_fails(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Without our patch the prefill scheduler dies on the first KV send. Strict xfail: when a
    future SGLang works here unpatched, this XPASSes, the run fails, and pd_cpu can go."""
    result = _run_driver(tiny_model_dir, tmp_path, patched=False)
    if result.get("output_ids") is not None and result["output_ids"] == result["reference"]:
        return  # works unpatched now
    blocking = result.get("prefill_error") or ""
    if BLOCKING_ERROR in blocking:
        raise RuntimeError(f"{blocking.strip()} (decode answered {result.get('decode_status')}: "
                           f"{str(result.get('decode_answer'))[:300]})")
    raise AssertionError(f"native PD failed differently than documented: {result}")


# --- driver (runs inside the network namespace) -------------------------------------------------

def _spawn(model: str, port: int, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "sglang_patch.launch_server", "--model-path", model,
            "--host", "127.0.0.1", "--port", str(port), *CPU_FLAGS, *args]
    with open(log, "wb") as fh:
        return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO),
                                start_new_session=True)


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _traceback_tail(log: Path) -> str:
    text = log.read_bytes().decode("utf-8", "replace") if log.exists() else ""
    lines = [ln for ln in text.splitlines() if ln.startswith(("RuntimeError", "ValueError",
                                                              "AssertionError", "KVTransfer"))]
    return "\n".join(lines[-3:])


def _pd_request(prefill_url: str, decode_url: str, router_port: int, ids: list[int],
                log: Path) -> tuple[int, Any, int | None]:
    """The request through our HTTP router; the prefill half's prompt tokens from the router's
    record of it (``/admin/stats`` ``recent``)."""
    import httpx

    argv = [sys.executable, "-m", "radix_global_cli", "router", "--host", "127.0.0.1",
            "--port", str(router_port), "--workers", prefill_url, decode_url,
            "--policy", "conductor", "--profile-max-tokens", "0"]
    with open(log, "wb") as fh:
        router = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO),
                                  start_new_session=True)
    base = f"http://127.0.0.1:{router_port}"
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(base_url=base, timeout=httpx.Timeout(240, connect=5)) as c:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    workers = c.get("/admin/workers").json()["workers"]
                    if len(workers) == 2:
                        break
                if router.poll() is not None or time.monotonic() > deadline:
                    return 0, f"router did not see both workers: {_traceback_tail(log)}", None
                time.sleep(0.5)
            r = c.post("/generate", json={"input_ids": ids, "sampling_params": {
                "max_new_tokens": 8, "temperature": 0.0}})
            try:
                answer: Any = r.json()
            except ValueError:
                answer = r.text
            prefill_tokens = None  # filled in when the prefill half answers (after the KV left)
            deadline = time.monotonic() + (60 if r.status_code == 200 else 0)
            while prefill_tokens is None and time.monotonic() < deadline:
                records = [x for x in c.get("/admin/stats").json()["recent"]
                           if x.get("accepted")]
                prefill_tokens = records[-1].get("prefill_prompt_tokens") if records else None
                if prefill_tokens is None:
                    time.sleep(0.5)
            return r.status_code, answer, prefill_tokens
    finally:
        router.terminate()
        try:
            router.wait(timeout=20)
        except subprocess.TimeoutExpired:
            router.kill()


def driver(out: Path, model: str, work: Path, patched: bool) -> None:
    from radix_global import trace

    os.environ["SGLANG_HOST_IP"] = "127.0.0.1"  # only `lo` exists: SGLang cannot guess an IP
    # The launch wrapper carries pd_cpu into SGLang's processes; the stock run switches it off.
    from sglang_patch import pd_cpu

    if patched:
        os.environ.pop(cpu_compat.ENV_DISABLED, None)
    else:
        os.environ[cpu_compat.ENV_DISABLED] = pd_cpu.PATCH_NAME
    ids = trace.synthesize_prompt([4242, 4243, 4244, 4245], 4 * 512, 48)  # 192 tokens
    result: dict[str, Any] = {"prompt_tokens": len(ids)}
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model).eval()
    with torch.no_grad():
        result["reference"] = hf.generate(torch.tensor([ids]), max_new_tokens=8,
                                          do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
    del hf
    p_port, d_port, bootstrap = 31000, 31001, 31100  # a private namespace: nothing else there
    p_log, d_log = work / "prefill.log", work / "decode.log"
    pd = ["--disaggregation-transfer-backend", "mooncake_tcp", "--radix-global-pool-id",
          f"native-{os.getpid()}", "--radix-global-pool-capacity-gb", "0.05"]
    sems = semaphores()
    procs = [
        _spawn(model, p_port, [*pd, "--disaggregation-mode", "prefill",
                               "--disaggregation-bootstrap-port", str(bootstrap)], p_log),
        # The wrapper turns HiCache on; SGLang refuses HiCache on a decode worker without a
        # radix cache, so the decode worker keeps one (SGLang's experimental decode radix).
        _spawn(model, d_port, [*pd, "--disaggregation-mode", "decode",
                               "--disaggregation-decode-enable-radix-cache"], d_log),
    ]
    try:
        deadline = time.monotonic() + 1000
        for proc, url, log in zip(procs, (f"http://127.0.0.1:{p_port}",
                                          f"http://127.0.0.1:{d_port}"), (p_log, d_log),
                                  strict=True):
            while not _healthy(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    result["startup_error"] = f"{log.name}: {_traceback_tail(log)}"
                    out.write_text(json.dumps(result))
                    return
                time.sleep(1.0)
        status, answer, result["prefill_prompt_tokens"] = _pd_request(
            f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}", 31200, ids,
            work / "router.log")
        result["decode_status"], result["decode_answer"] = status, answer
        if isinstance(answer, dict) and status == 200:
            result["output_ids"] = answer.get("output_ids")
        time.sleep(3.0)  # let the prefill scheduler's crash reach its log
        result["prefill_error"] = _traceback_tail(p_log)
        result["decode_error"] = _traceback_tail(d_log)
    finally:
        import psutil

        descendants = []
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                descendants += psutil.Process(proc.pid).children(recursive=True)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
        for child in descendants:  # nothing of ours may outlive the namespace's driver
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        sweep_semaphores(sems, groups=[proc.pid for proc in procs])
        from sglang_patch.pool.shm_pool import destroy_pool

        destroy_pool(f"native-{os.getpid()}")
        out.write_text(json.dumps(result))


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--driver":
    sys.path.insert(0, str(REPO))
    driver(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), sys.argv[5] == "patched")
