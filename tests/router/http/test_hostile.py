"""Hostile clients (issue: the red-team pass): a client cannot reach another tenant's namespace,
abort or pre-empt another client's request, get past the admin check through a proxy header,
or make the router crash, stall or hold connections. Each test failed on the router before the
fix it guards."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from router.keying.tenants import SHARED, Tenant, effective_salt

PROMPT = " ".join(f"w{i}" for i in range(40))  # 40 tokens = 10 pages of 4


@pytest.fixture
def tenants_router(upstreams, router_factory, tmp_path):
    peer, server = upstreams()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.acme]\napi_keys = ["k-acme"]\n'
                       '[tenants.pub]\napi_keys = ["k-pub"]\nshared = true\n')
    # approx_cache predicts from what it routed: a hit shows in x-radix-prefix-tokens
    router = router_factory(workers=(server.url,), tenants_file=str(tenants),
                            policy="approx_cache")
    router.wait_workers(1)
    return peer, router


def test_client_salt_only_narrows_its_own_namespace():
    acme = Tenant("acme", "tenant:acme")
    assert effective_salt(acme, None) == "tenant:acme"
    assert effective_salt(acme, "s1") == "tenant:acme/s1"
    # a shared tenant naming an isolated tenant's salt stays in the shared namespace's part
    assert effective_salt(SHARED, "tenant:acme") == "shared/tenant:acme"
    assert effective_salt(SHARED, "tenant:acme") != effective_salt(acme, None)
    with pytest.raises(ValueError):
        effective_salt(acme, {"not": "a string"})


def test_shared_tenant_cannot_read_an_isolated_tenants_pages(tenants_router):
    peer, router = tenants_router
    body = {"model": "tiny", "prompt": PROMPT}
    with router.client() as c:
        for _ in range(2):
            r = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer k-acme"})
            assert r.status_code == 200
        assert int(r.headers["x-radix-prefix-tokens"]) > 0  # acme hits its own pages
        for salt in ("tenant:acme", "tenant:acme/", "acme"):
            r = c.post("/v1/completions", json={**body, "cache_salt": salt},
                       headers={"Authorization": "Bearer k-pub"})
            assert r.status_code == 200
            assert r.headers["x-radix-prefix-tokens"] == "0", salt  # no prediction
            assert peer.requests[-1][1]["cache_salt"] != "tenant:acme"  # no engine hit
        r = c.post("/v1/completions", json={**body, "cache_salt": ["x"]},
                   headers={"Authorization": "Bearer k-pub"})
        assert r.status_code == 400


def test_no_client_field_reaches_another_tenants_namespace(tenants_router):
    """Every field a client controls (salt, rid, model/adapter names, lora_path, headers) on a
    shared tenant's request for a prompt only acme has sent: no prediction, no engine request
    under acme's salt, and the same response headers as a request for a prompt nobody has
    sent. Each try uses its own prompt, so a hit could only be acme's."""
    peer, router = tenants_router
    acme = {"Authorization": "Bearer k-acme"}
    pub = {"Authorization": "Bearer k-pub"}
    tries = [({"cache_salt": "tenant:acme"}, {}), ({"rid": "tenant:acme"}, {}),
             ({"model": "tiny:tenant:acme"}, {}), ({"lora_path": "tenant:acme"}, {}),
             ({}, {"x-tenant": "acme", "x-forwarded-for": "127.0.0.1",
                   "x-request-id": "tenant:acme"}),
             ({}, {"Authorization": "Bearer k-pub, Bearer k-acme"})]
    with router.client() as c:
        fresh = c.post("/v1/completions", json={"model": "tiny", "prompt": "w7 " * 40},
                       headers=pub)
        for i, (extra, headers) in enumerate(tries):
            body = {"model": "tiny", "prompt": " ".join(f"w{(i * 7 + k) % 200}"
                                                         for k in range(40))}
            for _ in range(2):
                assert c.post("/v1/completions", json=body, headers=acme).status_code == 200
            r = c.post("/v1/completions", json={**body, **extra}, headers={**pub, **headers})
            if r.status_code != 200:  # refused outright (an unknown adapter, a bad key)
                assert r.status_code in (400, 401, 404), (extra, headers, r.text)
                continue
            assert r.headers["x-radix-prefix-tokens"] == "0", (extra, headers)
            assert peer.requests[-1][1].get("cache_salt") != "tenant:acme", (extra, headers)
            assert set(r.headers) == set(fresh.headers), (extra, headers)


def test_tenant_names_with_a_slash_are_refused(tmp_path):
    from router.keying.tenants import TenantError, Tenants

    with pytest.raises(TenantError, match="/"):
        Tenants.from_mapping({"tenants": {"a/b": {"api_keys": ["k"]}}})


def test_client_rid_is_a_label_never_the_engine_rid(upstreams, router_factory):
    peer, server = upstreams()
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    with router.client() as c:
        a = c.post("/generate", json={"input_ids": [1, 2, 3], "rid": "victim"})
        b = c.post("/generate", json={"input_ids": [1, 2, 3], "rid": "victim"})  # pre-claim
        assert a.status_code == b.status_code == 200
    rids = [body["rid"] for _, body in peer.requests]
    assert "victim" not in rids and len(set(rids)) == 2  # ours, distinct: no duplicate
    assert all(len(r) >= 24 for r in rids)  # unguessable (96 random bits), not a counter
    assert [x.get("client_request_id") for x in router.state.recent] == ["victim", "victim"]


def test_a_client_cannot_abort_another_clients_request(upstreams, router_factory):
    peer, server = upstreams()
    peer.mode = "slow"  # the victim's answer takes 5 s
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    victim: dict[str, httpx.Response] = {}

    def send_victim() -> None:
        with router.client() as c:
            victim["r"] = c.post("/generate", json={"input_ids": [1, 2, 3], "rid": "v1"})

    t = threading.Thread(target=send_victim)
    t.start()
    deadline = time.monotonic() + 5
    while not peer.requests and time.monotonic() < deadline:
        time.sleep(0.02)
    engine_rid = peer.requests[0][1]["rid"]
    for rid in ("v1", engine_rid):  # the victim's label, or its engine rid if leaked
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=router.url,
                                                            timeout=0.3) as c:
            c.post("/generate", json={"input_ids": [1, 2, 3], "rid": rid})
    time.sleep(0.3)
    assert engine_rid not in peer.aborted
    t.join(10)
    assert victim["r"].status_code == 200


def test_client_request_ids_never_reach_an_engine(upstreams, router_factory):
    peer, server = upstreams()
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3]}, headers={"x-request-id": "vic"})
        assert r.status_code == 200
        # vLLM keys requests by x-request-id: the engine sees the router's id, never the client's
        assert peer.headers[-1]["x-request-id"] == peer.requests[-1][1]["rid"]
        r = c.post("/generate", json={"input_ids": [[1, 2], [3, 4]], "rid": ["a"]})
        assert r.status_code == 400 and "one string per prompt" in r.text
        r = c.post("/generate", json={"input_ids": [[1]] * 5000})
        assert r.status_code == 400 and "batch" in r.text


@pytest.mark.parametrize("rid", ["a\r\nx-evil: 1", "nul\x00", "tab\there", "x" * 300, 5])
def test_bad_rid_is_a_400_and_nothing_reaches_the_engine(upstreams, router_factory, rid):
    peer, server = upstreams()
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3], "rid": rid})
        assert r.status_code == 400 and "rid" in r.json()["error"]["message"]
        assert peer.requests == []
        assert c.post("/generate", json={"input_ids": [1, 2, 3]}).status_code == 200


def test_deeply_nested_json_is_a_400(upstreams, router_factory):
    peer, server = upstreams()
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    deep = b'{"input_ids": [1, 2], "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with router.client() as c:
        r = c.post("/generate", content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "nested" in r.json()["error"]["message"]
        assert peer.requests == []


def test_huge_text_prompt_refused_before_tokenizing(upstreams, router_factory, monkeypatch):
    from router.keying.tokenize import ModelTokenizer

    def no_tokenize(self, text):  # the fix refuses by bytes: the tokenizer is never asked
        raise AssertionError("tokenized a prompt that cannot fit")

    peer, server = upstreams(context_length=512)
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    monkeypatch.setattr(ModelTokenizer, "encode_text", no_tokenize)
    with router.client() as c:
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": "w1 " * 300_000})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "context_length_exceeded"
        assert peer.requests == []


@pytest.mark.parametrize("header", ["X-Forwarded-Host", "True-Client-IP", "X-Client-IP",
                                    "X-Forwarded-Proto", "Via", "CF-Connecting-IP"])
def test_admin_without_token_refuses_any_forwarding_header(router_factory, header):
    router = router_factory(workers=())
    with router.client() as c:
        assert c.get("/admin/workers").status_code == 200  # loopback, no token: allowed
        assert c.get("/admin/workers", headers={header: "10.1.2.3"}).status_code == 401


def test_admin_body_is_bounded(router_factory):
    router = router_factory(workers=())
    with router.client() as c:
        r = c.post("/admin/workers", content=b"{" + b" " * (1 << 20) + b"}")
        assert r.status_code == 413


@pytest.mark.parametrize(("field", "value"), [
    ("worker_id", "w\r\nx-evil: 1"), ("worker_id", "w\x00"), ("dp_size", 100_000),
    ("page_size", 10**23), ("model", "m" * 1000), ("bootstrap_port", 70000),
    ("place", "rack 1"), ("place", "a/b/c/d/e")])
def test_admin_registration_is_bounded(router_factory, field, value):
    router = router_factory(workers=())
    info = {"worker_id": "w1", "url": "http://127.0.0.1:9", "model": "m", "namespace": "m@1",
            "page_size": 4, "engine": "other", field: value}
    with router.client() as c:
        r = c.post("/admin/workers", json=info)
        assert r.status_code == 400, r.text
        assert c.get("/admin/workers").json()["workers"] == []


def test_requests_total_counts_the_status_the_client_got(upstreams, router_factory):
    _, server = upstreams()
    router = router_factory(workers=(server.url,), max_retries=0)
    router.wait_workers(1)
    server.stop()  # the worker is gone: the forward ends in 503 (connection refused)
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3]})
        assert r.status_code == 503, r.text
        text = c.get("/metrics").text
    assert 'radix_global_http_requests_total{endpoint="/generate",status="503"} 1.0' in text
    requests = text.split("radix_global_http_requests_total")[1].split("# HELP")[0]
    assert 'status="200"' not in requests


def test_idle_and_half_open_connections_are_closed():
    import uvicorn

    from router.transport.http_server import ServerLimits, server_config

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):  # the whole body first, as the router does
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    limits = ServerLimits(header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=1,
                          max_connections=64)
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, "warning", limits))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        for first in (b"", b"POST /x HTTP/1.1\r\nHost: a\r\n",  # idle; headers never end
                      b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab"):  # body
            conn = socket.create_connection(("127.0.0.1", port))
            conn.settimeout(5)
            conn.sendall(first)
            t0 = time.monotonic()
            assert conn.recv(1024) == b""  # closed by the server
            assert time.monotonic() - t0 < 3
            conn.close()
    finally:
        server.should_exit = True
        thread.join(5)


@pytest.fixture
def lying_peer(upstreams):
    """A worker whose ``/server_info`` reports ``report`` over a sane answer."""
    def start(report: dict):
        peer, server = upstreams()
        peer.report = report
        return peer, server

    return start


@pytest.mark.parametrize(("report", "field"), [
    ({"page_size": "16"}, "page_size"), ({"page_size": 1e9}, "page_size"),
    ({"page_size": 10**9}, "page_size"), ({"context_length": 10**12}, "context_length"),
    ({"context_length": 1e12}, "context_length"), ({"dp_size": "two"}, "dp_size"),
    ({"served_model_name": ["x"]}, "served_model_name"),
    ({"kv_events_config": "[1]"}, "kv_events_config"),
    ({"page_size": 16}, "page_size = 16 but the registration says 4")])
def test_a_registered_worker_reporting_unusable_server_info_is_refused(
        router_factory, lying_peer, report, field):
    """Issue 35 item 7: such a worker got a 500 with a traceback and stayed registered (page
    size), or was accepted with the prompt-size limit off for its model (a 1e12 context)."""
    _, server = lying_peer(report)
    router = router_factory(workers=(), heartbeat_timeout_s=600)
    info = {"worker_id": "w1", "url": server.url, "model": "tiny", "namespace": "tiny@1",
            "page_size": 4}
    with router.client() as c:
        r = c.post("/admin/workers", json=info)
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert field in message and "/server_info" in message and "Traceback" not in r.text
        assert c.get("/admin/workers").json()["workers"] == []


def test_a_registered_worker_that_starts_reporting_garbage_is_deregistered(
        router_factory, lying_peer):
    peer, server = lying_peer({})
    router = router_factory(workers=(), heartbeat_timeout_s=600)
    info = {"worker_id": "w1", "url": server.url, "model": "tiny", "namespace": "tiny@1",
            "page_size": 4}
    with router.client() as c:
        assert c.post("/admin/workers", json=info).status_code == 201
        assert router.state.registry.get("w1").context_length == 512
        peer.report = {"page_size": 1e9}
        r = c.post("/admin/workers", json={**info, "dp_size": 2})  # a new record: asked again
        assert r.status_code == 400 and "page_size" in r.text, r.text
        assert c.get("/admin/workers").json()["workers"] == []
