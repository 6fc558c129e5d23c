"""Fuzzing the router's HTTP surface: every inference endpoint and the admin API get random JSON
(known fields with values of every type, deep and wide nesting, huge numbers, control characters)
and random headers. Oracle: a clear answer (a status the endpoint documents, an OpenAI error body
for every refusal, never a router 500 or an empty reply), no hang (a client timeout), and the
router still answers a valid request correctly afterwards.

``RG_FUZZ_EXAMPLES`` (default 150 per endpoint) sizes a run; with ``-s`` the outcome counts are
printed (``docs/robustness.md`` records a larger run).
"""

from __future__ import annotations

import collections
import os
import string
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import pytest
from http_peer import ServerThread, Upstream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.config import RouterConfig
from router.http.app import build_app
from router.state import RouterState

EXAMPLES = int(os.environ.get("RG_FUZZ_EXAMPLES", "150"))
FIELDS = ["model", "prompt", "messages", "input_ids", "text", "rid", "cache_salt", "stream",
          "max_tokens", "sampling_params", "ttft_slo_s", "tbt_slo_s", "lora_path", "tools",
          "chat_template_kwargs", "role", "content", "n", "stop", "worker_id", "url"]
ANSWERED = {200, 201, 400, 401, 404, 409, 413, 422, 429, 503}
OUTCOMES: collections.Counter[str] = collections.Counter()

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(string.printable + "\x00\r\n\u2028é漢", max_size=40)
           | st.sampled_from(["tiny", "tiny:ad1", "w1 w2 w3", "user", "assistant"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=6), max_leaves=40)
BASES = {"/generate": [{"input_ids": [1, 2, 3, 4]}, {"text": "w1 w2 w3"}],
         "/v1/completions": [{"model": "tiny", "prompt": "w1 w2"}],
         "/v1/chat/completions": [{"model": "tiny", "messages": [{"role": "user",
                                                                  "content": "w1"}]}]}


def bodies(endpoint: str) -> st.SearchStrategy[dict[str, Any]]:
    """Random objects, and valid requests with a few fields replaced (they get past parsing)."""
    noise = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)
    mutated = st.tuples(st.sampled_from(BASES[endpoint]), noise).map(lambda bn: {**bn[0],
                                                                                **bn[1]})
    return noise | mutated | st.tuples(st.sampled_from(BASES[endpoint]), st.sampled_from(
        FIELDS), values).map(lambda b: {**b[0], b[1]: b[2]})


@pytest.fixture(scope="module")
def live(tokenizer_dir: str) -> Iterator[tuple[Upstream, str]]:
    peer = Upstream(model_path=tokenizer_dir, context_length=256)
    upstream = ServerThread(peer.app).start()
    state = RouterState(RouterConfig.from_options(workers=(upstream.url,), policy="conductor",
                                                  profile_max_tokens=0, health_check_interval_s=0.2,
                                                  max_body_bytes=1 << 20))
    router = ServerThread(build_app(state), router=True).start()
    with httpx.Client(base_url=router.url, timeout=10) as c:
        for _ in range(100):
            if c.get("/health").status_code == 200:
                break
            import time

            time.sleep(0.05)
    yield peer, router.url
    router.stop()
    upstream.stop()
    if OUTCOMES:
        print("\nfuzz outcomes:", dict(sorted(OUTCOMES.items())))


def _check(r: httpx.Response, endpoint: str) -> None:
    relayed = "x-radix-worker" in r.headers  # the engine's own answer, passed on
    OUTCOMES[f"{endpoint} {r.status_code}{' relayed' if relayed else ''}"] += 1
    if relayed:
        return
    assert r.status_code in ANSWERED, (endpoint, r.status_code, r.text[:300])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"], r.text[:300]


def _still_serves(base: str) -> None:
    with httpx.Client(base_url=base, timeout=10) as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3, 4, 5]})
        assert r.status_code == 200 and r.json()["text"].startswith("hello"), r.text


@pytest.mark.parametrize("endpoint", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_inference_endpoints_answer_any_json_clearly(live, endpoint: str) -> None:
    _, base = live

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=bodies(endpoint))
    def one(body: dict[str, Any]) -> None:
        with httpx.Client(base_url=base, timeout=10) as c:
            try:
                raw = msgspec.json.encode(body)
            except OverflowError:  # ints beyond 64 bits: send as JSON text, as a client could
                import json

                raw = json.dumps(body).encode()
            _check(c.post(endpoint, content=raw, headers={"content-type": "application/json"}),
                   endpoint)

    one()
    _still_serves(base)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
       headers=st.dictionaries(st.sampled_from(["authorization", "content-type", "x-request-id",
                                                "content-encoding", "x-forwarded-for", "accept"]),
                               st.text(string.printable.strip(), max_size=30), max_size=4))
def test_raw_bytes_and_headers(live, raw: bytes, headers: dict[str, str]) -> None:
    _, base = live
    with httpx.Client(base_url=base, timeout=10) as c:
        _check(c.post("/generate", content=raw, headers=headers), "raw")


REGISTRATION = {"worker_id": "fz", "url": "http://127.0.0.1:9", "model": "fz",
                "namespace": "fz@1", "page_size": 4, "engine": "other"}
registrations = st.tuples(st.sampled_from([
    *REGISTRATION, "role", "dp_size", "kv_events_endpoint", "pool_id", "bootstrap_port",
    "kv_bytes_per_token", "compute_domain"]), values).map(lambda kv: {**REGISTRATION, kv[0]: kv[1]})


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(body=registrations | st.dictionaries(st.sampled_from(list(REGISTRATION)), values,
                                            max_size=10))
def test_admin_registration_answers_any_json_clearly(live, body: dict[str, Any]) -> None:
    _, base = live
    with httpx.Client(base_url=base, timeout=10) as c:
        try:
            raw = msgspec.json.encode(body)
        except OverflowError:
            return
        r = c.post("/admin/workers", content=raw)
        _check(r, "admin")
        if r.status_code == 201:  # a valid random worker: take it out again (an id may hold
            # "#", "?" or "%": quoted, else the delete misses it and its model stays served)
            gone = c.delete(f"/admin/workers/{quote(r.json()['worker_id'], safe='')}")
            assert gone.status_code == 200, (r.json()["worker_id"], gone.text[:200])


def test_router_still_serves_after_fuzzing(live) -> None:
    _still_serves(live[1])
