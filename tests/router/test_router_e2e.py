"""End to end: two real SGLang CPU workers (SGLang's own ``--kv-events-config``), the router with
the conductor policy and its embedded index fed by the workers' KV events.

A multi-turn conversation must land where its history is cached: verified by the routing decision
(``x-radix-worker``, predicted prefix) and by the engine's own ``cached_tokens``; and, as a
control, the same prompt sent straight to the other worker finds nothing cached there.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from chat_e2e import cached_tokens, chat, reply, text, wait_indexed, wait_router_ready
from http_peer import ServerThread, free_port
from servers import sglang_server

from router.config import RouterConfig
from router.http.app import build_app
from router.state import RouterState

pytestmark = [pytest.mark.e2e, pytest.mark.sglang]
PAGE = 16


def _engine_args() -> list[str]:
    events = {"publisher": "zmq", "bind": True, "endpoint": f"tcp://127.0.0.1:{free_port()}",
              "topic": "kv-events"}
    return ["--served-model-name", "tiny", "--page-size", str(PAGE), "--max-total-tokens",
            "32768", "--enable-cache-report", "--kv-events-config", json.dumps(events)]


@pytest.fixture(scope="module")
def workers(tiny_model_dir: Path) -> Iterator[tuple[str, list[str]]]:
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        # Both start at once (start-up is minutes); never more than two SGLang processes.
        servers = list(pool.map(
            lambda _: stack.enter_context(sglang_server(tiny_model_dir, _engine_args())),
            range(2)))
        yield str(tiny_model_dir), [s.url for s in servers]


def test_conversation_lands_where_its_history_is_cached(workers):
    model, urls = workers
    state = RouterState(RouterConfig(workers=tuple(urls), policy="conductor",
                                     health_check_interval_s=1.0))
    server = ServerThread(build_app(state)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=300) as c:
            wait_router_ready(state)
            state.tokenizers.get(model).load()
            convs = {k: [{"role": "system", "content": text(k, 200)}] for k in (1, 2)}
            home: dict[int, str] = {}
            for turn in range(3):
                for k, messages in convs.items():
                    messages.append({"role": "user", "content": text(100 * k + turn, 40)})
                    r = chat(c, messages, max_tokens=4)
                    worker = r.headers["x-radix-worker"]
                    if turn == 0:
                        home[k] = worker
                    else:
                        # routed to the worker holding the history, which the engine confirms
                        assert worker == home[k], (k, turn, worker, home)
                        assert int(r.headers["x-radix-prefix-tokens"]) >= 200
                        assert cached_tokens(r) >= int(r.headers["x-radix-prefix-tokens"]) - PAGE
                    answer = reply(r) or "ok"
                    messages.append({"role": "assistant", "content": answer})
                    wait_indexed(state, worker, messages[:-1], model, PAGE, every_page=False)
            stats = c.get("/admin/stats").json()
        hits = [d for d in stats["recent"] if d.get("predicted_prefix_tokens", 0) > 0]
        assert len(hits) == 4 and all(d["engine_cached_tokens"] > 0 for d in hits)
        # control: the other worker has none of conversation 1's history (conversation 2 may
        # live there, but its first page already differs)
        other = next(u for u in urls if not u.endswith(home[1].split(":")[1]))
        probe = convs[1] + [{"role": "user", "content": "w0001"}]
        with httpx.Client(base_url=other, timeout=300) as direct:
            r = chat(direct, probe, max_tokens=4)
        assert cached_tokens(r) == 0
    finally:
        server.stop()
