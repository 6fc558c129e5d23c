"""router/pd/pool_front.py: the pool PD hand-off behind the real HTTP front end, with real HTTP peer
workers (``http_peer.Upstream``) on loopback. Real SGLang: ``test_pd_pool_http_e2e.py``."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from http_peer import ServerThread, Upstream
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from radix_global.types import Namespace, Role, WorkerId
from router.cli.main import config_from_args
from router.config import ConfigError, RouterConfig
from router.routing.contract import RouteRequest, WorkerState
from router.routing.decode_select import DecodeSelector


class DecodePeer(Upstream):
    """A decode-role peer that reports a KV capacity in /server_info, as SGLang does."""

    capacity = 10_000

    async def _info(self, request: Request) -> Response:
        info = dict(json.loads(bytes((await super()._info(request)).body)))
        return JSONResponse({**info, "max_total_num_tokens": self.capacity})


@pytest.fixture
def pd_cluster(tokenizer_dir: str, router_factory: Any):
    started: list[ServerThread] = []

    def start(decodes: int = 1, capacity: int = 10_000, **options: Any):
        prefill = Upstream(model_path=tokenizer_dir, role="prefill")
        peers = [prefill]
        for _ in range(decodes):
            d = DecodePeer(model_path=tokenizer_dir, role="decode")
            d.capacity = capacity
            peers.append(d)
        servers = [ServerThread(p.app).start() for p in peers]
        started.extend(servers)
        options.setdefault("pd_mode", "pool")
        router = router_factory(workers=tuple(s.url for s in servers), policy="conductor",
                                **options)
        router.wait_workers(len(servers))
        return router, prefill, peers[1:], servers

    yield start
    for server in started:
        server.stop()


def _wait(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_generate_prefills_one_token_then_decodes(pd_cluster):
    router, prefill, (decode,), _ = pd_cluster()
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3, 4, 5],
                                      "sampling_params": {"max_new_tokens": 7}})
        assert r.status_code == 200, r.text
        assert r.json()["text"] == "hello from decode"
        rid = r.headers["x-radix-request-id"]
        assert r.headers["x-radix-decode-worker"] == router.state.registry.all()[1].info.worker_id
        (_, p_body), (_, d_body) = prefill.requests[-1], decode.requests[-1]
        assert p_body["sampling_params"]["max_new_tokens"] == 1 and p_body["stream"] is False
        assert p_body["rid"] == rid + "-prefill" and "bootstrap_room" not in p_body
        assert d_body["rid"] == rid and d_body["sampling_params"]["max_new_tokens"] == 7
        pd = c.get("/admin/stats").json()["pd"]
        assert pd["mode"] == "pool" and pd["configured_ratio"] == "1:1"
        assert pd["prefill"]["workers"] == 1 and pd["decode"]["workers"] == 1
        assert pd["decode_capacity_tokens"] == {decode_id(router): 10_000}
    assert router.state.routing.decode.reserved_tokens((WorkerId(decode_id(router)), 0)) == 0


def decode_id(router: Any) -> str:
    return next(e.info.worker_id for e in router.state.registry.all()
                if e.info.role == Role.DECODE)


def test_chat_stream_is_relayed_from_the_decode_worker(pd_cluster):
    router, prefill, (decode,), _ = pd_cluster()
    with router.client() as c, c.stream("POST", "/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hello world"}],
            "max_tokens": 5, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "data: [DONE]" and len(lines) == decode.chunks + 1
    (_, p_body), (_, d_body) = prefill.requests[-1], decode.requests[-1]
    assert p_body["max_tokens"] == 1 and p_body["stream"] is False
    assert d_body["stream"] is True and d_body["max_tokens"] == 5


def test_a_hand_off_is_booked_in_the_funnel_and_against_the_slos(pd_cluster):
    """The decision chose the prefill worker: the funnel reads its answer and is booked under
    it; the TTFT SLO judges the client's first byte, which the decode worker sent."""
    router, prefill, (decode,), _ = pd_cluster(ttft_slo_s=30)
    prefill.cached_tokens, decode.cached_tokens = 3, 7
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": list(range(1, 41)), "stream": True,
                                      "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200, r.text
        assert r.text.count("data:") > 1  # the decode worker's stream
        _wait(lambda: router.state.economics.stats() != {})  # booked as the relay closes
        metrics = c.get("/metrics").text
    econ = router.state.economics.stats()["tiny"]
    assert (econ["requests"], econ["prompt_tokens"], econ["delivered_tokens"]) == (1, 40, 3)
    # its estimates covered the prefill only: no TTFT saved against them
    assert (econ["ttft_saved_s"], econ["slower_than_cold"]) == (0.0, 0)
    prefill_id = next(e.info.worker_id for e in router.state.registry.all()
                      if e.info.role == Role.PREFILL)
    assert 'radix_global_delivered_prefix_tokens_total{model="tiny",tier="unsplit",' \
        f'worker="{prefill_id}"}} 3.0' in metrics
    admission = router.state.admission.stats()["models"]["tiny"]
    assert (admission["completed"], admission["ttft_met"], admission["ttft_missed"]) == (1, 1, 0)


def test_saturated_decode_pool_is_rejected_before_prefill(pd_cluster):
    router, prefill, (decode,), _ = pd_cluster(capacity=100)
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3, 4, 5],
                                      "sampling_params": {"max_new_tokens": 200}})
        assert r.status_code == 429, r.text
        assert "decode_kv" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1
        assert c.get("/admin/stats").json()["pd"]["rejected_before_prefill"] == 1
    assert prefill.requests == [] and decode.requests == []


def test_tbt_slo_rejects_before_prefill(pd_cluster):
    router, prefill, _, _ = pd_cluster(pd_tbt_slo_s=0.001)  # the TBT model predicts >= 20 ms
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {}})
        assert r.status_code == 429 and "tbt_slo" in r.json()["error"]["message"]
    assert prefill.requests == []


def test_client_disconnect_aborts_and_releases(pd_cluster):
    router, _, (decode,), _ = pd_cluster()
    decode.mode, decode.chunks = "slow", 50  # 10 s of stream
    with router.client() as c, c.stream("POST", "/generate", json={
            "input_ids": [1, 2, 3, 4, 5], "stream": True,
            "sampling_params": {"max_new_tokens": 9}}) as r:
        rid = r.headers["x-radix-request-id"]
        next(r.iter_lines())
    _wait(lambda: rid in decode.aborted)
    selector = router.state.routing.decode
    _wait(lambda: selector.reserved_tokens((WorkerId(decode_id(router)), 0)) == 0)
    assert router.state.routing.in_flight() == 0


def test_dead_decode_worker_is_replaced(pd_cluster):
    router, _, decodes, servers = pd_cluster(decodes=2, health_check_interval_s=3600)
    ids = [e.info.worker_id for e in router.state.registry.all() if e.info.role == Role.DECODE]
    by_url = {s.url: (peer, s) for peer, s in zip(decodes, servers[1:], strict=True)}
    first = min(ids)  # chosen first on a tie
    url = router.state.registry.find(first).info.url
    alive = next(peer for u, (peer, _) in by_url.items() if u != url)
    with router.client() as c:
        assert c.post("/generate", json={"input_ids": [1, 2, 3]}).status_code == 200
        assert by_url[url][0].requests and not alive.requests  # capacities known, tie -> first
        by_url[url][1].stop()
        for _ in range(2):
            r = c.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {}})
            assert r.status_code == 200, r.text
            assert r.json()["text"] == "hello from decode"
        pd = c.get("/admin/stats").json()["pd"]
        assert len(alive.requests) == 2 and pd["decode_retries"] == 1
        # The refusal reached health checking, which removed the worker ...
        assert router.state.registry.find(first) is None
        # ... and a worker that answers again comes back with the next health round (it used
        # to be excluded by the hand-off for the router's life).
        dead_peer, dead_server = by_url[url]
        revived = ServerThread(dead_peer.app, port=dead_server.port).start()
        loop = router.state.health._task.get_loop()
        asyncio.run_coroutine_threadsafe(router.state.health.check_once(), loop).result(10)
        assert router.state.registry.find(first) is not None
        before = len(dead_peer.requests)
        r = c.post("/generate", json={"input_ids": [4, 5, 6]})
        assert r.status_code == 200 and r.headers["x-radix-decode-worker"] == first
        assert len(dead_peer.requests) == before + 1
    revived.stop()


def test_mixed_workers_take_the_ordinary_path(upstreams, router_factory):
    mixed, server = upstreams()
    router = router_factory(workers=(server.url,), pd_mode="pool")
    router.wait_workers(1)
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3]})
        assert r.status_code == 200 and r.json()["text"] == "hello"
    assert mixed.requests[-1][1]["rid"] == r.headers["x-radix-request-id"]


def test_pd_options_from_cli_and_checked():
    assert RouterConfig().pd.mode == "native"
    cfg = config_from_args(["--pd-mode", "pool", "--pd-ratio", "1:3", "--pd-tbt-slo-s", "0.05"])
    assert (cfg.pd.mode, cfg.pd.ratio, cfg.slo.tbt_slo_s) == ("pool", "1:3", 0.05)
    with pytest.raises(ConfigError, match="pd_mode"):
        RouterConfig().replace(pd_mode="tcp")


def test_learned_capacity_is_the_headroom_when_the_engine_reports_none():
    sel, ns = DecodeSelector(), Namespace("m@1")
    d = WorkerState(WorkerId("d"), ns, role=Role.DECODE)
    req = RouteRequest("r", ns, 100, [], 4, output_tokens_hint=100)
    assert sel.choose(req, [d], None).accepted  # unknown capacity: trust the engine
    sel.capacity[WorkerId("d")] = 150
    assert sel.choose(req, [d], None).reason == "decode_kv"
    assert sel.choose(req, [d._replace(kv_headroom_tokens=400)], None).accepted  # reported wins



def test_status_command_shows_the_pd_pools(pd_cluster, capsys):
    from router.cli.status import main as status_main

    router, *_ = pd_cluster(pd_ratio="1:2")
    with router.client() as c:
        assert c.post("/generate", json={"input_ids": [1, 2, 3]}).status_code == 200
    assert status_main(["--router", router.url]) == 0
    out = capsys.readouterr().out
    assert "pd (pool): prefill 1 at" in out and "ratio 1:2 (suggested" in out


@pytest.mark.parametrize("path, stream", [("/v1/completions", False), ("/v1/completions", True),
                                          ("/v1/chat/completions", False), ("/generate", True)])
def test_every_shape_prefills_one_token(pd_cluster, path, stream):
    router, prefill, (decode,), _ = pd_cluster()
    body: dict[str, Any] = {"model": "tiny", "stream": stream}
    if path == "/generate":
        body.update(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 6})
    elif path == "/v1/completions":
        body.update(prompt="hello world", max_tokens=6)
    else:
        body.update(messages=[{"role": "user", "content": "hello"}], max_tokens=6)
    with router.client() as c:
        r = c.post(path, json=body)
    assert r.status_code == 200, r.text
    assert (r.text.rstrip().endswith("data: [DONE]")) is stream
    (p_path, p_body), (d_path, d_body) = prefill.requests[-1], decode.requests[-1]
    assert p_path == d_path == path and p_body["stream"] is False
    if path == "/generate":
        assert p_body["sampling_params"]["max_new_tokens"] == 1
    else:
        assert p_body["max_tokens"] == 1 and d_body["max_tokens"] == 6
    assert d_body.get("stream", False) is stream


def test_a_body_the_hand_off_cannot_take_is_a_400(pd_cluster):
    """``sampling_params`` that is not an object used to escape the hand-off as a raw 500."""
    router, prefill, decodes, _ = pd_cluster()
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": "x"})
        assert r.status_code == 400 and "sampling_params" in r.json()["error"]["message"]
        assert prefill.requests == [] and decodes[0].requests == []
        assert router.state.routing.in_flight() == 0
        assert c.post("/generate", json={"input_ids": [1, 2, 3]}).status_code == 200


def test_a_batch_is_refused_by_the_pool_hand_off_with_a_reason(pd_cluster):
    router, prefill, _, _ = pd_cluster()
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [[1, 2, 3], [4, 5, 6]]})
        assert r.status_code == 400 and "one prompt per request" in r.text
        assert prefill.requests == [] and router.state.routing.in_flight() == 0
        sel = router.state.routing.decode
        assert all(sel.reserved_tokens((d.worker_id, 0)) == 0
                   for d in router.state.registry.all())
