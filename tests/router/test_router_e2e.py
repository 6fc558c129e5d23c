"""End to end: two real SGLang CPU workers (SGLang's own ``--kv-events-config``), the router with
the conductor policy and its embedded index fed by the workers' KV events.

A multi-turn conversation must land where its history is cached: verified by the routing decision
(``x-radix-worker``, predicted prefix) and by the engine's own ``cached_tokens``; and, as a
control, the same prompt sent straight to the other worker finds nothing cached there.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from chat_e2e import cached_tokens, chat, reply, text, wait_indexed, wait_router_ready
from http_peer import ServerThread, free_port
from servers import sglang_server

from radix_global.keys import page_keys
from radix_global.types import Namespace, WorkerId
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
    state = RouterState(RouterConfig.from_options(workers=tuple(urls), policy="conductor",
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


def _router(urls: list[str], **options: Any) -> tuple[RouterState, ServerThread]:
    state = RouterState(RouterConfig.from_options(workers=tuple(urls), policy="conductor",
                                                  health_check_interval_s=1.0, **options))
    return state, ServerThread(build_app(state)).start()


def _history_pages(state: RouterState, worker: str, messages: list[dict[str, str]],
                   model: str) -> int:
    keys = page_keys(state.tokenizers.get(model).encode_chat(messages), PAGE)
    ns = Namespace(state.registry.models()["tiny"])
    held = state.index.index.match(ns, keys, time.monotonic()).matched.get((WorkerId(worker), 0))
    return 0 if held is None else held.gpu


def test_a_restarted_router_routes_to_the_holders_from_its_snapshot(workers, tmp_path: Path):
    """docs/interfaces.md, "The router's index snapshot". Router A serves turn 1 of two
    conversations and stops; router B starts from A's index snapshot (and its saved prefill
    profiles) and, before any new KV event, sends turn 2 to the worker holding the history, which
    the engine confirms. Control: a router started without the snapshot (same engines, same moment)
    holds none of the history. After turn 2 the engines' events continue B's restored streams
    without a resync."""
    model, urls = workers
    snap, profiles = str(tmp_path / "index.snap"), str(tmp_path / "profiles.json")
    convs = {k: [{"role": "system", "content": text(10 + k, 200)},
                 {"role": "user", "content": text(500 + k, 40)}] for k in (1, 2)}
    home: dict[int, str] = {}
    state, server = _router(urls, index_snapshot=snap, profiles_file=profiles)
    try:
        with httpx.Client(base_url=server.url, timeout=300) as c:
            wait_router_ready(state)
            state.tokenizers.get(model).load()
            for k, messages in convs.items():
                r = chat(c, messages, max_tokens=4)
                home[k] = r.headers["x-radix-worker"]
                messages.append({"role": "assistant", "content": reply(r) or "ok"})
                wait_indexed(state, home[k], messages[:-1], model, PAGE)
    finally:
        server.stop()  # writes the snapshot
    assert Path(snap).stat().st_size > 0

    def started(state: RouterState) -> None:
        deadline = time.monotonic() + 60
        while len(state.registry) < 2 or state.profiler.pending():
            assert time.monotonic() < deadline, "router did not discover both workers"
            time.sleep(0.2)
        state.tokenizers.get(model).load()

    blind, server = _router(urls, profiles_file=profiles)  # the control: no snapshot
    try:
        started(blind)
        assert all(_history_pages(blind, home[k], m[:-1], model) == 0 for k, m in convs.items())
    finally:
        server.stop()

    state, server = _router(urls, index_snapshot=snap, profiles_file=profiles)
    try:
        started(state)
        outcomes = state.profiler.outcomes
        assert all(p["state"] == "restored" for p in outcomes.values()), outcomes
        for k, messages in convs.items():
            assert _history_pages(state, home[k], messages[:-1], model) > 200 // PAGE
        assert state.index.stats()["subscriber"]["batches"] == 0  # nothing new came in
        with httpx.Client(base_url=server.url, timeout=300) as c:
            for k, messages in convs.items():
                messages.append({"role": "user", "content": text(600 + k, 40)})
                r = chat(c, messages, max_tokens=4)
                assert r.headers["x-radix-worker"] == home[k], (k, r.headers, home)
                assert int(r.headers["x-radix-prefix-tokens"]) >= 200
                assert cached_tokens(r) >= int(r.headers["x-radix-prefix-tokens"]) - PAGE
                messages.append({"role": "assistant", "content": reply(r) or "ok"})
                wait_indexed(state, home[k], messages[:-1], model, PAGE)
        events = state.index.stats()["subscriber"]
        assert events["batches"] > 0 and events["resyncs"] == 0 and events["gaps"] == 0, events
        for k, messages in convs.items():  # the restored history is still there
            assert _history_pages(state, home[k], messages[:3], model) > 200 // PAGE
    finally:
        server.stop()


def test_clients_read_cached_tokens_and_one_error_shape_through_the_openai_sdk(workers):
    """docs/interfaces.md, "What the cache is worth, live". The OpenAI SDK reads
    ``usage.prompt_tokens_details.cached_tokens``: 0 on a cold first turn, > 0 on later turns,
    whole and streamed (usage chunk asked for). A stream that did not ask for usage gets no
    usage chunk, yet the router books its cached tokens (it asked the engine). The router's
    funnel equals the sums of its own per-request records. An engine's error (a prompt plus
    ``max_tokens`` over the context length) and the router's own (an unknown model) come in one
    shape."""
    import openai

    model, urls = workers
    state, server = _router(urls)
    try:
        wait_router_ready(state)
        state.tokenizers.get(model).load()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        create: Any = client.chat.completions.create  # typed per model name; read as answers
        messages: list[Any] = [{"role": "system", "content": text(31, 200)}]
        seen: list[int] = []
        for turn, (stream, usage) in enumerate([(False, None), (True, True), (True, False),
                                                (False, None)]):
            messages.append({"role": "user", "content": text(3100 + turn, 30)})
            args: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": 4,
                                    "temperature": 0}
            if not stream:
                answer = create(**args)
                assert answer.usage is not None and answer.usage.prompt_tokens_details
                seen.append(answer.usage.prompt_tokens_details.cached_tokens or 0)
                content = answer.choices[0].message.content
                assert "sglext" not in (answer.model_extra or {})  # the router's, not relayed
            else:
                opts = {"stream_options": {"include_usage": True}} if usage else {}
                chunks = list(create(stream=True, **args, **opts))
                with_usage = [c for c in chunks if c.usage is not None]
                if usage:
                    assert len(with_usage) == 1 and with_usage[0].choices == []
                    details = with_usage[0].usage.prompt_tokens_details
                    assert details is not None
                    seen.append(details.cached_tokens or 0)
                else:
                    assert with_usage == [] and all(c.choices for c in chunks)
                content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert not any("sglext" in (c.model_extra or {}) for c in chunks)
            messages.append({"role": "assistant", "content": content or "ok"})
            worker = state.recent[-1]["worker_id"]
            wait_indexed(state, worker, messages[:-1], model, PAGE, every_page=False)
        assert seen[0] == 0 and all(c > 0 for c in seen[1:]), seen
        records = list(state.recent)[-4:]
        assert records[2]["engine_cached_tokens"] > 0  # the stream that asked for no usage
        assert [r["engine_cached_tokens"] for r in records[:2] + records[3:]] == seen
        econ = state.economics.stats()["tiny"]
        assert econ["requests"] == 4
        assert econ["delivered_tokens"] == sum(r["engine_cached_tokens"] for r in records)
        assert econ["captured_tokens"] == sum(r["predicted_prefix_tokens"] for r in records)
        assert econ["available_tokens"] == sum(r["available_tokens"] for r in records) > 0
        assert econ["prompt_tokens"] == sum(r["input_tokens"] for r in records)
        # SGLang split its cached tokens by tier for the router (return_cached_tokens_details)
        registry = state.metrics.registry
        tiers = {t: sum(registry.get_sample_value(
            "radix_global_delivered_prefix_tokens_total",
            {"model": "tiny", "worker": w, "tier": t}) or 0 for w in {r["worker_id"]
                                                             for r in records})
            for t in ("device", "host", "storage", "unsplit")}
        assert tiers["unsplit"] == 0 and sum(tiers.values()) == econ["delivered_tokens"], tiers
        # one refusal: a client's own SLO no engine can meet (it may only tighten the router's)
        messages.append({"role": "user", "content": text(3150, 30)})
        with pytest.raises(openai.RateLimitError):
            create(model="tiny", messages=messages, max_tokens=4, extra_body={"ttft_slo_s": 1e-6})
        admission = state.admission.stats()["models"]["tiny"]
        assert (admission["accepted"], admission["rejected"]) == (4, {"ttft_slo": 1})
        assert admission["completed"] == 4 and admission["acceptance_rate"] == 0.8

        shapes = []
        with httpx.Client(base_url=server.url, timeout=300) as c:
            for body, status in (
                    ({"model": "tiny", "max_tokens": 9000,
                      "messages": [{"role": "user", "content": text(3200, 40)}]}, 400),
                    ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404)):
                r = c.post("/v1/chat/completions", json=body)
                assert r.status_code == status, r.text
                shapes.append(r.json())
        assert [set(s) for s in shapes] == [{"error"}, {"error"}], shapes
        assert [set(s["error"]) for s in shapes] == [{"message", "type", "param", "code"}] * 2
        assert shapes[0]["error"]["type"] == "context_length_exceeded"
        assert shapes[1]["error"]["type"] == "model_not_found"
    finally:
        server.stop()
