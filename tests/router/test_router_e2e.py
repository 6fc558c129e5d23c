"""End to end: two real SGLang CPU workers (SGLang's own ``--kv-events-config``), the router with
the conductor policy and its embedded index fed by the workers' KV events.

A multi-turn conversation must land where its history is cached: verified by the routing decision
(``x-radix-worker``, predicted prefix) and by the engine's own ``cached_tokens``; and, as a
control, the same prompt sent straight to the other worker finds nothing cached there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from http_peer import ServerThread, free_port

from radix_global.keys import page_keys
from radix_global.trace import synthetic_word
from radix_global.types import Namespace, WorkerId
from router.app import build_app
from router.config import RouterConfig
from router.state import RouterState

pytestmark = [pytest.mark.e2e, pytest.mark.sglang]
PAGE = 16


def _start_sglang(model: str, port: int, kv_port: int, log: Path) -> subprocess.Popen[bytes]:
    from sglang_patch import cpu_compat

    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model,
           "--served-model-name", "tiny", "--device", "cpu", "--attention-backend",
           "torch_native", "--sampling-backend", "pytorch", "--disable-overlap-schedule",
           "--page-size", str(PAGE), "--host", "127.0.0.1", "--port", str(port),
           "--max-total-tokens", "32768", "--enable-cache-report",
           "--kv-events-config", json.dumps({"publisher": "zmq", "bind": True,
                                             "endpoint": f"tcp://127.0.0.1:{kv_port}",
                                             "topic": "kv-events"})]
    with log.open("wb") as out:
        return subprocess.Popen(cmd, env=cpu_compat.child_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait_healthy(urls: list[str], procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = set(urls)
    while pending:
        assert time.monotonic() < deadline, f"SGLang not ready: {pending}"
        assert all(p.poll() is None for p in procs), "an SGLang worker exited"
        for url in list(pending):
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    pending.discard(url)
            except httpx.HTTPError:
                pass
        time.sleep(1)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    from sglang_patch.make_model import main as make_model

    base = tmp_path_factory.mktemp("e2e")
    model = str(base / "model")
    assert make_model([model]) == 0
    urls, procs = [], []
    try:
        for i in range(2):  # never more than two SGLang processes at once
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            procs.append(_start_sglang(model, port, free_port(), base / f"sgl{i}.log"))
        _wait_healthy(urls, procs, timeout=480)
        yield model, urls
    finally:
        for p in procs:
            _stop(p)


def _chat(client: httpx.Client, messages: list[dict[str, str]]) -> httpx.Response:
    r = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def _cached(r: httpx.Response) -> int:
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def _text(seed: int, words: int) -> str:
    return " ".join(synthetic_word((seed * 7919 + i) % 4000) for i in range(words))


def _wait_indexed(state: RouterState, worker: str, messages: list[dict[str, str]],
                  model_path: str) -> None:
    """KV events arrive asynchronously: wait until the index holds the prompt's pages."""
    tok = state.tokenizers.get(model_path)
    keys = page_keys(tok.encode_chat(messages), PAGE)
    ns = Namespace(state.registry.models()["tiny"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = state.index.index.match(ns, keys, time.monotonic())
        if match.matched.get((WorkerId(worker), 0), None) is not None:
            return
        time.sleep(0.2)
    raise AssertionError(f"KV events of {worker} never reached the index")


def test_conversation_lands_where_its_history_is_cached(workers):
    model, urls = workers
    state = RouterState(RouterConfig(workers=tuple(urls), policy="conductor",
                                     health_check_interval_s=1.0))
    server = ServerThread(build_app(state)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=300) as c:
            deadline = time.monotonic() + 60
            while len(state.registry) < 2:
                assert time.monotonic() < deadline, "router did not discover both workers"
                time.sleep(0.2)
            # Until both prefill curves are profiled, one worker would be priced with the
            # (fast) default prior and the other with its measured CPU curve.
            deadline = time.monotonic() + 300
            while state.profiling_pending():
                assert time.monotonic() < deadline, "profiling the workers did not finish"
                time.sleep(0.5)
            state.tokenizers.get(model).load()
            convs = {k: [{"role": "system", "content": _text(k, 200)}] for k in (1, 2)}
            home: dict[int, str] = {}
            for turn in range(3):
                for k, messages in convs.items():
                    messages.append({"role": "user", "content": _text(100 * k + turn, 40)})
                    r = _chat(c, messages)
                    worker = r.headers["x-radix-worker"]
                    if turn == 0:
                        home[k] = worker
                    else:
                        # routed to the worker holding the history, which the engine confirms
                        assert worker == home[k], (k, turn, worker, home)
                        assert int(r.headers["x-radix-prefix-tokens"]) >= 200
                        assert _cached(r) >= int(r.headers["x-radix-prefix-tokens"]) - PAGE
                    reply = r.json()["choices"][0]["message"]["content"] or "ok"
                    messages.append({"role": "assistant", "content": reply})
                    _wait_indexed(state, worker, messages[:-1], model)
            stats = c.get("/admin/stats").json()
        hits = [d for d in stats["recent"] if d.get("predicted_prefix_tokens", 0) > 0]
        assert len(hits) == 4 and all(d["engine_cached_tokens"] > 0 for d in hits)
        # control: the other worker has none of conversation 1's history (conversation 2 may
        # live there, but its first page already differs)
        other = next(u for u in urls if not u.endswith(home[1].split(":")[1]))
        probe = convs[1] + [{"role": "user", "content": "w0001"}]
        with httpx.Client(base_url=other, timeout=300) as direct:
            r = _chat(direct, probe)
        assert _cached(r) == 0
    finally:
        server.stop()
