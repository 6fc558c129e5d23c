"""Bad input and failing workers: always a 4xx/5xx with a message or a clean error event; the
router keeps serving afterwards."""

from __future__ import annotations

import json
import time

import httpx
import pytest


@pytest.fixture
def one(upstreams, router_factory):
    peer, server = upstreams(context_length=64)
    router = router_factory(workers=(server.url,), max_body_bytes=4096)
    router.wait_workers(1)
    with router.client() as c:
        yield peer, router, c
    # after every case the router still answers
    with router.client() as c:
        assert c.get("/health").status_code in (200, 503)


def _message(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


def test_malformed_json(one):
    _, _, c = one
    r = c.post("/v1/completions", content=b"{not json",
               headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in _message(r)
    r = c.post("/v1/completions", json=[1, 2])
    assert r.status_code == 400 and "JSON object" in _message(r)
    # a number out of range where the router does not read: found when the body must be
    # rewritten (the client sent its own rid), and a 400 then too, not a router error
    peer, _, _ = one
    sent = len(peer.requests)
    r = c.post("/generate", content=b'{"input_ids": [1, 2], "temperature": 1e400, "rid": "x"}')
    assert r.status_code == 400 and "out of range" in _message(r), r.text
    assert len(peer.requests) == sent


def test_unknown_model(one):
    _, _, c = one
    r = c.post("/v1/chat/completions", json={"model": "nope", "messages": [
        {"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and "unknown model" in _message(r)


def test_prompt_over_context_length(one):
    _, _, c = one
    r = c.post("/v1/completions", json={"model": "tiny", "prompt": " ".join(["w1"] * 100)})
    assert r.status_code == 400 and "context length is 64" in _message(r)
    r = c.post("/generate", json={"input_ids": [1] * 64})
    assert r.status_code == 400


@pytest.mark.parametrize("ids", [[], [-1, 2], [1, "a"], [1, 10**6], [1.5], "abc", [True]])
def test_invalid_token_ids(one, ids):
    peer, _, c = one
    r = c.post("/generate", json={"input_ids": ids})
    assert r.status_code == 400, r.text
    assert "token" in _message(r) or "input_ids" in _message(r) or "text" in _message(r)
    assert peer.requests == []


def test_bad_messages(one):
    _, _, c = one
    for messages in ([], "hi", [{"content": "x"}], [1]):
        r = c.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})
        assert r.status_code == 400, (messages, r.text)


def test_oversized_body(one):
    peer, _, c = one
    r = c.post("/generate", json={"text": "w1 " * 5000})
    assert r.status_code == 413 and "larger than 4096" in _message(r)
    # chunked upload without content-length is cut off too
    r = c.post("/generate", content=iter([b'{"text": "' + b"w1 " * 2000, b'"}']))
    assert r.status_code == 413
    assert peer.requests == []


def test_no_healthy_worker_is_503(upstreams, router_factory):
    router = router_factory(workers=("http://127.0.0.1:9",))
    with router.client() as c:
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": "hello"})
        assert r.status_code == 503
        assert c.get("/health").status_code == 503


def test_worker_dies_mid_stream_gives_error_event(one):
    peer, _, c = one
    peer.mode = "die_mid_stream"
    with c.stream("POST", "/generate", json={"input_ids": [1, 2, 3], "stream": True}) as r:
        assert r.status_code == 200
        events = [ln[5:].strip() for ln in r.read().decode().splitlines()
                  if ln.startswith("data:")]
    assert json.loads(events[0])["text"] == "x"  # what was relayed stays
    assert "failed mid-stream" in json.loads(events[-2])["error"]["message"]
    assert events[-1] == "[DONE]"
    peer.mode = "ok"
    assert c.post("/generate", json={"input_ids": [1, 2]}).status_code == 200


def test_dead_worker_is_retried_on_another_and_leaves_the_pool(upstreams, router_factory):
    alive_peer, alive = upstreams()
    _, dead = upstreams()
    router = router_factory(workers=(alive.url, dead.url), health_check_interval_s=30)
    router.wait_workers(2)
    dead.stop()  # refuses connections from now on; the health check has not noticed yet
    with router.client() as c:
        for _ in range(4):
            r = c.post("/generate", json={"input_ids": [1, 2, 3]})
            assert r.status_code == 200
            assert r.headers["x-radix-worker"].endswith(str(alive.port))
        stats = c.get("/admin/stats").json()
    assert len(alive_peer.requests) == 4
    assert [w["worker_id"] for w in stats["workers"]] == [f"127.0.0.1:{alive.port}"]


def test_client_disconnect_aborts_engine_request(one):
    peer, router, _ = one
    peer.mode = "slow"
    peer.chunks = 50
    with httpx.Client(base_url=router.url, timeout=30) as c, c.stream(
            "POST", "/generate", json={"input_ids": [1, 2, 3], "stream": True}) as r:
        rid = r.headers["x-radix-request-id"]
        next(r.iter_raw())  # one chunk arrived, then the client goes away
    deadline = time.monotonic() + 10
    while rid not in peer.aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert peer.aborted == [rid]
    assert router.state.routing.in_flight() == 0  # the queue estimate was released
    assert router.state.totals["client_aborts"] == 1


def test_a_client_that_leaves_after_done_was_answered_not_aborted(one):
    """Clients close on ``[DONE]``, often before the engine's side of the stream ends: that is
    an answer (booked, its cache numbers read), not an abort."""
    peer, router, _ = one
    peer.mode = "linger"
    with httpx.Client(base_url=router.url, timeout=30) as c, c.stream(
            "POST", "/generate", json={"input_ids": [1, 2, 3], "stream": True}) as r:
        body = b""
        for chunk in r.iter_raw():
            body += chunk
            if body.rstrip().endswith(b"data: [DONE]"):
                break  # and the client closes
    deadline = time.monotonic() + 10
    while router.state.routing.in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert router.state.routing.in_flight() == 0
    assert peer.aborted == [] and router.state.totals["client_aborts"] == 0
    assert router.state.totals["ok"] == 1
    assert router.state.recent[-1]["engine_cached_tokens"] == 0  # its answer was read


def test_client_disconnect_aborts_non_streaming_request(one):
    peer, router, _ = one
    peer.mode = "slow"
    with httpx.Client(base_url=router.url, timeout=0.5) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/generate", json={"input_ids": [1, 2, 3]})
    deadline = time.monotonic() + 10
    while not peer.aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(peer.aborted) == 1
    assert router.state.routing.in_flight() == 0


def test_client_disconnect_aborts_every_prompt_of_a_batch(one):
    peer, router, _ = one
    peer.mode = "slow"
    batch = {"input_ids": [[1, 2, 3], [4, 5, 6]], "rid": ["a", "b"]}
    with httpx.Client(base_url=router.url, timeout=0.5) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/generate", json=batch)
    sent = peer.requests[-1][1]["rid"]
    assert isinstance(sent, list) and len(sent) == 2
    deadline = time.monotonic() + 10
    while len(peer.aborted) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(peer.aborted) == sorted(sent)  # the engine rids it holds, not "<rid>"
    assert router.state.routing.in_flight() == 0


def test_client_gone_before_the_forward_began_releases_the_estimate(one):
    """A client that left while the router tokenized or routed: the decision was recorded, so
    the queue estimate must still be released (it used to stay held for the router's life)."""
    import asyncio

    from router.keying.request_body import RequestKind, decode_body
    from router.request.inbound import Inbound
    from router.request.relay import Forward
    from router.request.route import Routed, route
    from router.routing.contract import RouteRequest
    from router.transport.http_server import DISCONNECT_HOOK, DisconnectHook

    peer, router, _ = one
    st = router.state
    entry = st.registry.all()[0]
    req = RouteRequest("rg-test", entry.info.namespace, 3, [], entry.info.page_size)
    raw = b'{"input_ids":[1,2,3]}'
    inbound = Inbound(req, decode_body(RequestKind.GENERATE, raw), raw, None,
                      RequestKind.GENERATE, "/generate", entry.info.model, {}, 0.0)
    hook = DisconnectHook()
    hook.fire()  # the connection is already gone

    async def scenario() -> None:
        routed = route(st, inbound, set())
        assert isinstance(routed, Routed) and st.routing.in_flight() == 1
        await Forward(st, inbound, routed)({"type": "http", "extensions": {
            DISCONNECT_HOOK: hook}}, None, None)  # type: ignore[arg-type]

    asyncio.run(scenario())
    assert st.routing.in_flight() == 0
    assert peer.requests == [] and peer.aborted == []  # nothing was sent, nothing to abort
