"""``/admin/shared-prefixes`` and ``/admin/pool-aliases`` (docs/interfaces.md,
"Shared platform prefixes across isolated tenants") through the router's HTTP app, in front of a
loopback peer speaking the worker protocol."""

from __future__ import annotations

import threading
import time

import pytest

from radix_global.aliases import alias_pairs
from radix_global.keys import page_digests

PREFIX = list(range(10, 74))  # 64 tokens


@pytest.fixture
def platform(upstreams, router_factory, tmp_path):
    peer, server = upstreams()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.a]\napi_keys = ["k-a"]\n[tenants.b]\napi_keys = ["k-b"]\n'
                       '[tenants.pub]\napi_keys = ["k-pub"]\nshared = true\n'
                       f'[shared_prefixes.agent]\nmodel = "tiny"\ntoken_ids = {PREFIX}\n')
    router = router_factory(workers=(server.url,), tenants_file=str(tenants))
    router.wait_workers(1)
    (entry,) = router.state.registry.all()
    return peer, router, entry.info.namespace, entry.info.page_size


def _head(tokens, page_size, salt):
    return page_digests(tokens, page_size, cache_salt=salt)[0].hex()


def test_a_tenant_request_starting_with_the_prefix_can_be_resolved_by_the_pool(platform):
    _, router, namespace, ps = platform
    tokens = PREFIX + [200, 201, 202] * 10
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": tokens}, headers={"Authorization": "Bearer k-b"})
        assert r.status_code == 200, r.text
        head = _head(tokens, ps, "tenant:b")
        pairs = c.get("/admin/pool-aliases", params={"namespace": namespace, "head": head}).json()
        assert pairs["pairs"] == [list(p) for p in alias_pairs(PREFIX, ps, "tenant:b")]
        # A head no eligible request had, another namespace, a malformed head.
        other = _head(tokens, ps, "tenant:a")
        assert c.get("/admin/pool-aliases",
                     params={"namespace": namespace, "head": other}).json()["pairs"] == []
        assert c.get("/admin/pool-aliases",
                     params={"namespace": "x@1", "head": head}).json() == {"pairs": [],
                                                                          "prefixes": 1}
        for bad in ({"namespace": namespace}, {"namespace": namespace, "head": "zz" * 32},
                    {"namespace": namespace, "head": head.upper()}):
            assert c.get("/admin/pool-aliases", params=bad).status_code == 400
    assert router.state.totals["shared_prefix_requests"] == 1


def test_what_is_not_shared(platform):
    """A request that diverges inside the first page, a shared tenant's, and a prefix of fewer
    than one page never make an alias; a client's own salt still shares the prefix (narrowed)."""
    peer, router, namespace, ps = platform
    with router.client() as c:
        def ask(tokens, key, salt):
            body = {"input_ids": tokens}
            if salt:
                body["cache_salt"] = salt
            assert c.post("/generate", json=body,
                          headers={"Authorization": f"Bearer {key}"}).status_code == 200
            sent = peer.requests[-1][1].get("cache_salt")
            head = _head(tokens, ps, sent) if sent else page_digests(tokens, ps)[0].hex()
            return c.get("/admin/pool-aliases",
                         params={"namespace": namespace, "head": head}).json()["pairs"]

        assert ask([9, *PREFIX], "k-a", None) == []
        assert ask(PREFIX[: ps - 1] + [250] * 40, "k-a", None) == []
        assert ask(PREFIX, "k-pub", None) == []  # no salt: the canonical keys themselves
        narrowed = ask(PREFIX + [5] * 20, "k-a", "mine")
        assert narrowed == [list(p) for p in alias_pairs(PREFIX, ps, "tenant:a/mine")]


def test_prefixes_are_managed_through_the_admin_api(platform):
    _, router, namespace, ps = platform
    with router.client() as c:
        listed = c.get("/admin/shared-prefixes").json()["shared_prefixes"]
        assert [p["name"] for p in listed] == ["agent"]
        r = c.post("/admin/shared-prefixes", json={"name": "tools", "model": "tiny",
                                                   "text": "You are a careful tool-using agent."})
        assert r.status_code == 201, r.text
        assert c.post("/admin/shared-prefixes", json={"name": "tools", "model": "tiny",
                                                      "token_ids": [1]}).status_code == 409
        for bad in ({"name": "x y", "model": "tiny", "token_ids": [1]},
                    {"name": "x", "token_ids": [1]},
                    {"name": "x", "model": "tiny"},
                    {"name": "x", "model": "tiny", "token_ids": [1], "text": "both"},
                    {"name": "x", "model": "tiny", "token_ids": [-1]},
                    {"name": "x", "model": "tiny", "boundary": 5, "token_ids": [1]},
                    {"name": "exists", "token_ids": [1]},  # no model; its name is no 409
                    ["not", "an", "object"]):
            r = c.post("/admin/shared-prefixes", json=bad)
            assert r.status_code == 400, (bad, r.text)
            assert "error" in r.json()
        assert c.post("/admin/shared-prefixes", content=b"{nope").status_code == 400
        assert c.delete("/admin/shared-prefixes/agent").status_code == 200
        assert c.delete("/admin/shared-prefixes/agent").status_code == 404
        assert [p["name"] for p in c.get("/admin/shared-prefixes").json()["shared_prefixes"]] \
            == ["tools"]
        # Deleted: the tenants recorded before get no alias any more, and none is recorded.
        tokens = PREFIX + [3] * 16
        head = _head(tokens, ps, "tenant:b")
        c.post("/admin/shared-prefixes", json={"name": "agent", "model": "tiny",
                                               "token_ids": PREFIX})
        c.post("/generate", json={"input_ids": tokens}, headers={"Authorization": "Bearer k-b"})
        q = {"namespace": namespace, "head": head}
        assert c.get("/admin/pool-aliases", params=q).json()["pairs"]
        assert c.delete("/admin/shared-prefixes/agent").status_code == 200
        assert c.get("/admin/pool-aliases", params=q).json()["pairs"] == []
        c.post("/generate", json={"input_ids": tokens}, headers={"Authorization": "Bearer k-b"})
        assert c.get("/admin/pool-aliases", params=q).json() == {"pairs": [], "prefixes": 1}


def test_admin_token_guards_the_alias_endpoint(upstreams, router_factory):
    _, server = upstreams()
    router = router_factory(workers=(server.url,), admin_token="secret")
    router.wait_workers(1)
    with router.client() as c:
        q = {"namespace": "tiny@1", "head": "ab" * 32}
        assert c.get("/admin/pool-aliases", params=q).status_code == 401
        assert c.get("/admin/shared-prefixes").status_code == 401
        ok = c.get("/admin/pool-aliases", params=q, headers={"Authorization": "Bearer secret"})
        assert ok.status_code == 200 and ok.json() == {"pairs": [], "prefixes": 0}


def _words(start: int, n: int) -> str:
    return " ".join(f"w{(start + k) % 200}" for k in range(n))


def test_health_stays_responsive_while_text_prefixes_are_tokenized(platform, monkeypatch):
    """Issue 35 item 8: text prefixes were tokenized on the event loop at the first eligible
    request (16 of 1 MiB stalled /health for 4 s). Now each is tokenized when it is registered,
    off the loop: with a tokenizer that takes 0.3 s a prefix the router answers /health within
    100 ms throughout, and the first request after the registration matches the prefix. (The
    test tokenizer's own cost is made explicit with a sleep, which leaves the GIL to the loop as
    the Rust tokenizer's batch path does.)"""
    from router.keying.tokenize import ModelTokenizer

    _, router, namespace, ps = platform
    real = ModelTokenizer.encode_text

    def slow(self, text):
        if len(text) > 1000:  # the prefixes, not the probe of the fast path
            time.sleep(0.3)
        return real(self, text)

    monkeypatch.setattr(ModelTokenizer, "encode_text", slow)
    texts = [_words(7 * i, 400) for i in range(8)]  # under the 512-token context
    latencies: list[float] = []
    stop = threading.Event()

    def probe():
        with router.client() as h:
            while not stop.is_set():
                t0 = time.monotonic()
                assert h.get("/health").status_code == 200
                latencies.append(time.monotonic() - t0)
                time.sleep(0.02)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        with router.client() as c:
            for i, text in enumerate(texts):
                t0 = time.monotonic()
                r = c.post("/admin/shared-prefixes", json={"name": f"t{i}", "model": "tiny",
                                                           "text": text})
                assert r.status_code == 201, r.text
                assert time.monotonic() - t0 >= 0.3  # tokenized before the answer
            assert router.state.shared_prefixes.pending("tiny") == 0
            tok = router.state.tokenizers.get(router.state.registry.all()[0].model_path)
            ids = real(tok, texts[3])
            body = {"input_ids": [*ids, 5, 6, 7, 8]}
            assert c.post("/generate", json=body,
                          headers={"Authorization": "Bearer k-b"}).status_code == 200
            head = _head(body["input_ids"], ps, "tenant:b")
            pairs = c.get("/admin/pool-aliases", params={"namespace": namespace, "head": head})
    finally:
        stop.set()
        prober.join(10)
    assert len(latencies) > 20 and max(latencies) < 0.1, max(latencies)
    assert pairs.json()["pairs"] == [list(p) for p in alias_pairs(ids, ps, "tenant:b")]
    assert router.state.totals["shared_prefix_requests"] == 1  # the first request shared it


def test_a_text_prefix_over_its_token_bound_is_refused_at_registration(platform):
    """A 1 MB text prefix (accepted before, then tokenized on the loop at the first request) is
    tokenized when registered and refused: it has more tokens than a prefix may hold."""
    _, router, _, _ = platform
    with router.client() as c:
        text = "w0 " + "w1 " * 333_330  # ~1,000,000 bytes: a body under 1 MiB
        r = c.post("/admin/shared-prefixes", json={"name": "big", "model": "tiny",
                                                   "text": text})
        assert r.status_code == 400 and "tokens" in r.json()["error"]["message"], r.text
        names = [p["name"] for p in c.get("/admin/shared-prefixes").json()["shared_prefixes"]]
        assert "big" not in names
        assert c.get("/health").status_code == 200
