"""The router's HTTP front end against real loopback peers speaking the worker protocol."""

from __future__ import annotations

import json
import time

import httpx

from radix_global.keys import page_keys


def _sse_events(text: str) -> list[str]:
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def test_models_health_and_generate(upstreams, router_factory):
    peer, server = upstreams(model="tiny")
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    with router.client() as c:
        models = c.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        assert c.get("/health").status_code == 200
        r = c.post("/generate", json={"text": "hello world the system prompt"})
        assert r.status_code == 200, r.text
        assert r.json()["text"] == "hello"
        assert r.headers["x-radix-worker"] == "127.0.0.1:" + str(server.port)
        # the engine receives the request with a router-assigned rid (for /abort_request)
        path, body = peer.requests[-1]
        assert path == "/generate" and body["rid"] == r.headers["x-radix-request-id"]
        r = c.post("/generate", json={"input_ids": [5, 6, 7, 8, 9]})
        assert r.status_code == 200, r.text
        assert peer.requests[-1][1]["input_ids"] == [5, 6, 7, 8, 9]


def test_fields_the_router_does_not_read_reach_the_engine_unchanged(upstreams, router_factory):
    """The typed body holds only what the router reads: every other field (an engine option the
    router has never heard of, nested values, a float's spelling) arrives as the client sent
    it, and the router's own fields replace the client's instead of doubling them."""
    peer, server = upstreams(model="tiny")
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    raw = (b'{"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2, "top_p": 0.50},'
           b' "engine_option_of_tomorrow": {"a": [1, {"b": null}]}, "rid": "mine"}')
    with router.client() as c:
        r = c.post("/generate", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
    sent = peer.raw_requests[-1]  # the client sent a rid: re-encoded, with the router's
    assert json.loads(sent) == {**json.loads(raw), "rid": r.headers["x-radix-request-id"]}
    assert sent.count(b'"rid"') == 1
    raw = raw.replace(b', "rid": "mine"', b"")  # no router field: spliced, the bytes kept
    with router.client() as c:
        assert c.post("/generate", content=raw).status_code == 200
    assert peer.raw_requests[-1].endswith(raw[1:])
    assert b'"top_p": 0.50' in peer.raw_requests[-1]  # as sent, not re-encoded as 0.5


def test_two_models_each_with_its_own_pool(upstreams, router_factory):
    _, a = upstreams(model="alpha")
    peer_b, b = upstreams(model="beta")
    router = router_factory(workers=(a.url, b.url))
    router.wait_workers(2)
    with router.client() as c:
        assert sorted(m["id"] for m in c.get("/v1/models").json()["data"]) == ["alpha", "beta"]
        for _ in range(3):
            r = c.post("/v1/completions", json={"model": "beta", "prompt": "hello"})
            assert r.status_code == 200
            assert r.headers["x-radix-worker"].endswith(str(b.port))
        assert len(peer_b.requests) == 3
        assert c.post("/generate", json={"text": "hello"}).status_code == 400  # which model?


def test_chat_stream_passthrough_and_usage(upstreams, router_factory):
    peer, server = upstreams()
    peer.cached_tokens = 4
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    with router.client() as c:
        with c.stream("POST", "/v1/chat/completions", json={
                "model": "tiny", "stream": True,
                "messages": [{"role": "user", "content": "hello world"}]}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            text = r.read().decode()
        events = _sse_events(text)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["prompt_tokens_details"]["cached_tokens"] == 4
        stats = c.get("/admin/stats").json()
    (worker,) = stats["workers"]
    assert worker["routed"] == 1 and worker["hit_rate"] == 0.4  # 4 of 10 cached, from usage
    assert stats["recent"][-1]["ttft_s"] is not None


def test_tenant_salt_forwarded_and_keys_salted(upstreams, router_factory, tmp_path):
    peer, server = upstreams()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.acme]\napi_keys = ["k-acme"]\n'
                       '[tenants.pub]\napi_keys = ["k-pub"]\nshared = true\n')
    router = router_factory(workers=(server.url,), tenants_file=str(tenants))
    router.wait_workers(1)
    with router.client() as c:
        body = {"model": "tiny", "prompt": "hello"}
        assert c.post("/v1/completions", json=body).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert c.post("/v1/completions", json=body, headers=bad).status_code == 401
        ok = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer k-acme"})
        assert ok.status_code == 200
        assert peer.requests[-1][1]["cache_salt"] == "tenant:acme"
        c.post("/v1/completions", json=body, headers={"Authorization": "Bearer k-pub"})
        assert "cache_salt" not in peer.requests[-1][1]


def test_rejection_is_429_with_retry_after_before_any_compute(upstreams, router_factory):
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), policy="conductor")
    router.wait_workers(1)
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": list(range(1, 40)), "ttft_slo_s": 1e-9})
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert "ttft" in r.json()["error"]["message"]
        assert peer.requests == []
        assert c.post("/generate", json={"input_ids": [1, 2, 3]}).status_code == 200


def test_metrics_and_admin_stats(upstreams, router_factory):
    _, server = upstreams()
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    with router.client() as c:
        c.post("/generate", json={"text": "hello world"})
        text = c.get("/metrics").text
        assert 'radix_global_decisions_total{model="tiny",outcome="accepted"} 1.0' in text
        assert "radix_global_router_stage_seconds_bucket" in text
        assert c.get("/admin/diagnostics").json()["findings"][0]["problem"] == "no_kv_events"


def test_router_keys_equal_engine_page_keys(tokenizer_dir):
    """The router keys a prompt with the model's own tokenizer, page by page."""
    from router.keying.prompt import prompt_token_ids
    from router.keying.request_body import ChatBody
    from router.keying.tokenize import TokenizerCache

    tok = TokenizerCache().get(tokenizer_dir)
    ids = prompt_token_ids(ChatBody(messages=[{"role": "user", "content": "w1 w2 w3"}]), tok,
                           None)
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = ref.apply_chat_template([{"role": "user", "content": "w1 w2 w3"}], tokenize=False,
                                   add_generation_prompt=True)
    assert ids == ref.encode(text, add_special_tokens=False)
    assert page_keys(ids, 2) == page_keys(ref.encode(text, add_special_tokens=False), 2)


def test_admin_needs_token_when_configured(upstreams, router_factory):
    router = router_factory(admin_token="s3cret")
    with httpx.Client(base_url=router.url) as c:
        assert c.get("/admin/workers").status_code == 401
        assert c.get("/admin/workers", headers={"Authorization": "Bearer wrong"}).status_code == 401
        r = c.get("/admin/workers", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.json() == {"workers": []}


def test_admin_without_token_is_loopback_only_and_not_proxied(upstreams, router_factory):
    router = router_factory()
    with httpx.Client(base_url=router.url) as c:
        assert c.get("/admin/workers").status_code == 200
        for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
            # a reverse proxy on this host: the peer is loopback, the client may not be
            assert c.get("/admin/workers", headers={header: "203.0.113.7"}).status_code == 401


def _index_prompt(router, worker_id: str, ids: list[int], page_size: int = 4) -> None:
    """Put the prompt's pages in the index as the worker's KV events would."""
    from radix_global.ops import StorePages
    from radix_global.types import Location, Namespace, Tier, WorkerId

    ns = Namespace(router.state.registry.models()["tiny"])
    loc = Location(WorkerId(worker_id), 0, Tier.GPU)
    router.state.index.index.apply(StorePages(ns, loc, None, page_keys(ids, page_size)))


def test_disagreement_is_flagged_not_silent(upstreams, router_factory):
    """The index predicts hits on a worker whose engine never reports one -> flagged."""
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), policy="conductor", mismatch_min_requests=3)
    router.wait_workers(1)
    wid = f"127.0.0.1:{server.port}"
    ids = list(range(10, 42))
    _index_prompt(router, wid, ids)
    with router.client() as c:
        peer.cached_tokens = 0  # the engine keys pages differently: it never hits
        for _ in range(3):
            r = c.post("/generate", json={"input_ids": ids})
            assert int(r.headers["x-radix-prefix-tokens"]) > 0
            assert r.headers["x-radix-fetch-tokens"] == "0"  # a local hit: nothing to fetch
            assert int(r.headers["x-radix-predicted-queue-ms"]) >= 0
            assert int(r.headers["x-radix-predicted-ttft-ms"]) > 0
        problems = [f["problem"] for f in c.get("/admin/diagnostics").json()["findings"]]
        assert "predicted_hits_never_observed" in problems
        assert f'radix_global_key_mismatch{{worker="{wid}"}} 1.0' in c.get("/metrics").text


def test_metrics_are_read_not_written_by_a_scrape(upstreams, router_factory):
    """``radix_global_key_mismatch`` is what the counters say whenever the registry is collected: no
    diagnostics call (which a /metrics read used to make, writing gauges) is needed first, and
    scraping twice gives the same answer."""
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), policy="conductor", mismatch_min_requests=3)
    router.wait_workers(1)
    wid = f"127.0.0.1:{server.port}"
    ids = list(range(10, 42))
    _index_prompt(router, wid, ids)
    with router.client() as c:
        peer.cached_tokens = 0
        for _ in range(3):
            c.post("/generate", json={"input_ids": ids})
    rendered = router.state.metrics.render().decode()  # a collector's read, not /metrics
    assert f'radix_global_key_mismatch{{worker="{wid}"}} 1.0' in rendered
    assert router.state.metrics.render().decode().count("radix_global_key_mismatch{") == 1


def test_agreement_is_not_flagged(upstreams, router_factory):
    """Control for the test above: the same flow with engine hits raises no finding."""
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), policy="conductor", mismatch_min_requests=3)
    router.wait_workers(1)
    wid = f"127.0.0.1:{server.port}"
    ids = list(range(10, 42))
    _index_prompt(router, wid, ids)
    with router.client() as c:
        peer.cached_tokens = 28
        for _ in range(3):
            c.post("/generate", json={"input_ids": ids})
        problems = [f["problem"] for f in c.get("/admin/diagnostics").json()["findings"]]
        assert "predicted_hits_never_observed" not in problems
        assert f'radix_global_key_mismatch{{worker="{wid}"}} 0.0' in c.get("/metrics").text


def test_pd_disaggregation_sends_to_prefill_and_decode(upstreams, router_factory):
    """A prefill worker's decision pairs a decode worker: both get the request with one
    bootstrap room (SGLang's PD protocol); the client gets the decode worker's answer."""
    prefill, p_server = upstreams(role="prefill")
    decode, d_server = upstreams(role="decode")
    router = router_factory(workers=(p_server.url, d_server.url), policy="conductor")
    router.wait_workers(2)
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3, 4, 5]})
        assert r.status_code == 200, r.text
        assert r.json()["text"] == "hello from decode"
    deadline = time.monotonic() + 5
    while not prefill.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    (_, p_body), (_, d_body) = prefill.requests[-1], decode.requests[-1]
    assert p_body["bootstrap_room"] == d_body["bootstrap_room"]
    assert p_body["bootstrap_host"] == "127.0.0.1" and p_body["bootstrap_port"] == 8998
    # Two engine requests: the prefill half's rid is the decode half's with a suffix, so an
    # abort names exactly one of them.
    assert d_body["rid"] == r.headers["x-radix-request-id"]
    assert p_body["rid"] == d_body["rid"] + "-prefill"
    # A batch: one bootstrap room per prompt, the same on both halves (the one builder,
    # router.pd.protocol.native_body; the relay's own used one room for the whole batch).
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
                                      "rid": ["a", "b", "c"]})
        assert r.status_code == 200, r.text
    # The prefill half runs beside the decode half: the client's answer (the decode worker's)
    # can come back before the prefill peer has recorded its request.
    deadline = time.monotonic() + 5
    while len(prefill.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    (_, p_body), (_, d_body) = prefill.requests[-1], decode.requests[-1]
    rooms = p_body["bootstrap_room"]
    assert isinstance(rooms, list) and len(set(rooms)) == 3 and d_body["bootstrap_room"] == rooms
    assert p_body["bootstrap_host"] == ["127.0.0.1"] * 3
    assert d_body["rid"] == [f"{r.headers['x-radix-request-id']}-{i}" for i in range(3)]


def test_native_pd_answer_does_not_wait_for_the_prefill_half(upstreams, router_factory):
    """The client's answer is the decode worker's: a slow prefill half (SGLang's prefill server
    answers once its KV left) never delays it, and its cache numbers reach the request's record
    when they arrive."""
    prefill, p_server = upstreams(role="prefill")
    decode, d_server = upstreams(role="decode")
    prefill.mode = "slow"  # a non-streamed answer after 5 s
    router = router_factory(workers=(p_server.url, d_server.url), policy="conductor")
    router.wait_workers(2)
    with router.client() as c:
        t0 = time.monotonic()
        r = c.post("/generate", json={"input_ids": [1, 2, 3, 4, 5], "stream": True})
        assert r.status_code == 200 and time.monotonic() - t0 < 3.0
        rid = r.headers["x-radix-request-id"]
    record = next(x for x in router.state.recent if x["request_id"] == rid)
    assert record["ok"] and record["prefill_prompt_tokens"] is None  # not yet answered
    deadline = time.monotonic() + 10
    while record["prefill_prompt_tokens"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert record["prefill_prompt_tokens"] == 10  # the prefill half's meta_info, filled in
    assert decode.aborted == []


def test_native_pd_utilisation_report(upstreams, router_factory):
    """Native PD through the HTTP front end reports both pools' busy time (the ratio report of
    ``/admin/stats`` and ``radix-global status``), closes every busy span when the request ends,
    and counts PD admission rejections."""
    _, p_server = upstreams(role="prefill")
    _, d_server = upstreams(role="decode")
    router = router_factory(workers=(p_server.url, d_server.url), policy="conductor",
                            pd_ratio="1:2")
    router.wait_workers(2)
    with router.client() as c:
        assert c.get("/admin/stats").json()["pd"] is None  # nothing disaggregated yet
        assert c.post("/generate", json={"input_ids": [1, 2, 3, 4, 5]}).status_code == 200
        pd = c.get("/admin/stats").json()["pd"]
    assert pd["mode"] == "native" and pd["configured_ratio"] == "1:2"
    assert pd["prefill"]["workers"] == 1 and pd["decode"]["workers"] == 1
    assert pd["prefill"]["busy_s"] > 0 and pd["decode"]["busy_s"] > 0
    assert pd["decode"]["busy_s"] >= pd["prefill"]["busy_s"]  # decode waits for the prefill

    deadline = time.monotonic() + 5  # the prefill answer may land after the client's
    while router.state.pd_util._open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert router.state.pd_util._open == {}, "a busy span was left open"
    from radix_global.types import Role

    wid = next(e.worker_id for e in router.state.registry.all() if e.info.role == Role.DECODE)
    router.state.routing.decode.capacity[wid] = 10  # no KV room left for 100 output tokens
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {
            "max_new_tokens": 100}})
        assert r.status_code == 429 and "decode_kv" in r.text
        assert c.get("/admin/stats").json()["pd"]["rejected_before_prefill"] == 1


def test_native_pd_decode_refusal_blames_the_decode_worker_and_retries(upstreams,
                                                                          router_factory):
    """The paired decode worker refuses the connection: it (not the prefill worker) leaves the
    pool, the prefill side's copy of the request is aborted, and the request is retried with
    another decode worker under a new engine rid."""
    prefill, p_server = upstreams(role="prefill")
    _, dead_server = upstreams(role="decode")
    live, live_server = upstreams(role="decode")
    router = router_factory(workers=(p_server.url, dead_server.url, live_server.url),
                            policy="conductor", health_check_interval_s=60.0)
    router.wait_workers(3)
    by_url = {e.info.url: e.worker_id for e in router.state.registry.all()}
    dead, pre = by_url[dead_server.url], by_url[p_server.url]
    router.state.routing.decode.capacity.update({dead: 10**6, by_url[live_server.url]: 10**5})
    dead_server.stop()  # refuses connections from now on; the router still lists it
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3, 4, 5]})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == "hello from decode"
    rid = r.headers["x-radix-request-id"]
    assert rid.endswith("-pd1") and live.requests[-1][1]["rid"] == rid
    assert rid.removesuffix("-pd1") + "-prefill" in prefill.aborted  # first attempt's prefill
    ids = {e.worker_id for e in router.state.registry.all()}
    assert pre in ids and dead not in ids


def test_registration_from_another_host_must_name_addresses_reachable_from_here(tokenizer_dir):
    """A worker on another host that registers loopback (or ipc) addresses would have the router
    subscribe to the router's own loopback: refused with the flag that fixes it."""
    import asyncio

    from radix_global.registration import WorkerInfo, encode_worker_info
    from router.config import RouterConfig
    from router.http.app import build_app
    from router.state import RouterState

    def record(host: str, events: str) -> bytes:
        return encode_worker_info(WorkerInfo(
            worker_id=f"w-{host}", url=f"http://{host}:30000", model="tiny", namespace="tiny@1",
            page_size=4, kv_events_endpoint=events))

    async def post(peer: str, body: bytes) -> httpx.Response:
        state = RouterState(RouterConfig.from_options(admin_token="t", model_path=tokenizer_dir))
        transport = httpx.ASGITransport(build_app(state), client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
            return await c.post("/admin/workers", content=body,
                                headers={"Authorization": "Bearer t"})

    remote = "10.77.0.9"
    for host, events in [("127.0.0.1", f"tcp://{remote}:5557"), (remote, "tcp://127.0.0.1:5557"),
                         (remote, "ipc:///tmp/ev"), (remote, "tcp://localhost:5557"),
                         ("127.1", f"tcp://{remote}:5557"), (remote, "tcp://0:5557")]:
        r = asyncio.run(post(remote, record(host, events)))
        assert r.status_code == 400 and "--radix-global-advertise-host" in r.text, \
            (host, events, r.text)
    assert asyncio.run(post(remote, record(remote, f"tcp://{remote}:5557"))).status_code == 201
    # the single-host deployment: loopback addresses from a loopback peer (also IPv4-mapped,
    # a router listening on ::)
    for peer in ("127.0.0.1", "::ffff:127.0.0.1"):
        assert asyncio.run(post(peer, record("127.0.0.1", "tcp://127.0.0.1:5557"))
                           ).status_code == 201
    # ... but not when a proxy on this host relays a request from elsewhere
    async def proxied() -> httpx.Response:
        state = RouterState(RouterConfig.from_options(admin_token="t", model_path=tokenizer_dir))
        transport = httpx.ASGITransport(build_app(state), client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
            return await c.post("/admin/workers", content=record("127.0.0.1", "ipc:///tmp/e"),
                                headers={"Authorization": "Bearer t",
                                         "X-Forwarded-For": remote})
    assert asyncio.run(proxied()).status_code == 400


ADMIN_TOKEN = "adm-t0ken"

def test_basic_logins_read_and_never_write_and_web_pages_never_write(upstreams,
                                                                      router_factory):
    """A browser sends a cached Basic login with any page's form post (cross-site request
    forgery): Basic is for reads, and a write a web page made is refused, token or not."""
    import base64

    _, server = upstreams()
    router = router_factory(workers=(server.url,), admin_token=ADMIN_TOKEN)
    router.wait_workers(1)
    basic = {"Authorization": "Basic " + base64.b64encode(f"admin:{ADMIN_TOKEN}".encode()).decode()}
    bearer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    wid = f"127.0.0.1:{server.port}"
    with router.client() as c:
        assert c.get("/admin/stats", headers=basic).status_code == 200
        assert c.post(f"/admin/workers/{wid}/drain", headers=basic).status_code == 401
        for page in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
            assert c.post(f"/admin/workers/{wid}/drain",
                          headers={**bearer, **page}).status_code == 401
        assert c.post(f"/admin/workers/{wid}/drain", headers=bearer).status_code == 200
    loopback = router_factory(workers=(server.url,))  # no token: loopback clients
    loopback.wait_workers(1)
    with loopback.client() as c:
        assert c.post(f"/admin/workers/{wid}/drain",
                      headers={"Sec-Fetch-Site": "cross-site"}).status_code == 401
        assert c.post(f"/admin/workers/{wid}/drain").status_code == 200
