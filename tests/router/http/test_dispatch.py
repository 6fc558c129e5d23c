"""Router-side dispatch (docs/interfaces.md,
"Router-side dispatch: holding requests while the engines are busy") through the HTTP front end,
against a peer worker whose first chunk waits until the test lets it go (an engine busy
prefilling)."""

from __future__ import annotations

import contextlib
import threading
import time
from functools import partial
from typing import Any

import httpx
from waits import until

_until = partial(until, what="the condition", timeout_s=10.0, every_s=0.02)


def _stream(url: str, ids: list[int], out: dict[str, Any], key: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/generate", json={"input_ids": ids, "stream": True})
        out[key] = r


def _three_requests(router: Any, peer: Any) -> tuple[dict[str, Any], list[threading.Thread]]:
    """A long request the engine is busy with, then a long and a short one behind it."""
    out: dict[str, Any] = {}
    prompts = {"a": list(range(5, 200)), "b": list(range(5, 180)), "c": list(range(5, 12))}
    threads = []
    for key in ("a", "b", "c"):
        t = threading.Thread(target=_stream, args=(router.url, prompts[key], out, key))
        t.start()
        threads.append(t)
        if key == "a":
            _until(lambda: len(peer.requests) == 1)
        else:
            time.sleep(0.2)
    return out, threads


def _gated(upstreams: Any, router_factory: Any, **options: Any) -> tuple[Any, Any]:
    """A peer whose first chunks wait for ``peer.first_chunk``, and a router in front of it."""
    peer, server = upstreams()
    peer.first_chunk = threading.Event()
    options.setdefault("policy", "least_load")  # the factory's round_robin is never held
    router = router_factory(workers=(server.url,), **options)
    router.wait_workers(1)
    return peer, router


def _busy(router: Any, peer: Any, out: dict[str, Any]) -> threading.Thread:
    """A streaming request the peer is busy with (its first chunk waits)."""
    busy = threading.Thread(target=_stream, args=(router.url, list(range(5, 50)), out, "a"))
    busy.start()
    _until(lambda: len(peer.requests) == 1)
    return busy


def _arrival_lengths(peer: Any) -> list[int]:
    return [len(body["input_ids"]) for _, body in peer.requests]


def test_held_while_busy_then_the_shortest_goes_first(upstreams, router_factory):
    peer, router = _gated(upstreams, router_factory, dispatch="shortest_first", dispatch_depth=1)
    gate = router.state.routing.gate
    out, threads = _three_requests(router, peer)
    _until(lambda: gate.held() == 2)
    assert len(peer.requests) == 1  # the engine has only the one it is busy with
    with router.client() as c:
        assert "radix_global_dispatch_held_requests 2.0" in c.get("/metrics").text
    peer.first_chunk.set()
    for t in threads:
        t.join(30)
    assert _arrival_lengths(peer) == [195, 7, 175]  # the short one before the long one
    assert all(out[k].status_code == 200 for k in "abc")
    assert int(out["c"].headers["x-radix-hold-ms"]) >= 150
    held = {r["request_id"]: r["held_s"] for r in router.state.recent}
    assert held[out["c"].headers["x-radix-request-id"]] >= 0.15
    assert gate.held() == 0 and gate.in_flight((out["a"].headers["x-radix-worker"], 0)) == 0


def test_off_sends_everything_at_once(upstreams, router_factory):
    """The negative control of the test above: without the gate the busy engine gets all three
    in arrival order."""
    peer, router = _gated(upstreams, router_factory, dispatch="off")
    assert router.state.dispatcher is None
    out, threads = _three_requests(router, peer)
    _until(lambda: len(peer.requests) == 3)
    peer.first_chunk.set()
    for t in threads:
        t.join(30)
    assert _arrival_lengths(peer) == [195, 175, 7]
    assert "x-radix-hold-ms" not in out["c"].headers


def test_non_streaming_requests_are_not_held(upstreams, router_factory):
    peer, router = _gated(upstreams, router_factory, dispatch="fifo", dispatch_depth=1)
    out: dict[str, Any] = {}
    busy = _busy(router, peer, out)
    with router.client() as c:  # the router sees no first token of these: never held
        assert c.post("/generate", json={"input_ids": [5, 6, 7]}).status_code == 200
    peer.first_chunk.set()
    busy.join(30)
    assert out["a"].status_code == 200


def test_held_longer_than_the_request_timeout_is_503(upstreams, router_factory):
    peer, router = _gated(upstreams, router_factory, dispatch="fifo", dispatch_depth=1,
                            dispatch_timeout_s=1.0)
    out: dict[str, Any] = {}
    busy = _busy(router, peer, out)
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [5, 6, 7], "stream": True})
        assert r.status_code == 503 and "held at the router" in r.json()["error"]["message"]
        assert router.state.routing.gate.held() == 0
    peer.first_chunk.set()
    busy.join(30)
    assert len(peer.requests) == 1  # the one held too long never reached the engine


def test_a_request_that_would_miss_its_slo_after_the_hold_is_refused_at_once(
        upstreams, router_factory):
    """With a TTFT SLO, the work held ahead counts: 429 at arrival, not after waiting."""
    peer, router = _gated(upstreams, router_factory, policy="conductor", dispatch="fifo",
                            dispatch_depth=1)
    gate, cost = router.state.routing.gate, router.state.routing.cost
    out: dict[str, Any] = {}
    threads = [threading.Thread(target=_stream, args=(router.url, ids, out, key))
               for key, ids in (("a", list(range(5, 12))), ("b", list(range(5, 180))))]
    threads[0].start()
    _until(lambda: len(peer.requests) == 1)
    threads[1].start()
    _until(lambda: gate.held() == 1)
    (worker,) = router.state.registry.all()
    short = [5, 6, 7, 8, 9]
    alone_s = cost.prefill_s(worker.worker_id, len(short), 0)
    held_s = cost.prefill_s(worker.worker_id, 175, 0)
    with router.client() as c:
        t0 = time.monotonic()
        r = c.post("/generate", json={"input_ids": short, "stream": True,
                                      "ttft_slo_s": alone_s + 0.5 * held_s})
        assert r.status_code == 429 and "ttft_slo" in r.json()["error"]["message"]
        assert time.monotonic() - t0 < 2.0 and "retry-after" in r.headers
        # negative control: an SLO the hold fits in is held, then served
        ok = threading.Thread(target=lambda: out.update(c=c.post("/generate", json={
            "input_ids": short, "stream": True, "ttft_slo_s": alone_s + 2 * held_s + 1.0})))
        ok.start()
        _until(lambda: gate.held() == 2)
        peer.first_chunk.set()
        ok.join(30)
    for t in threads:
        t.join(30)
    assert out["c"].status_code == 200 and len(peer.requests) == 3


def test_a_client_that_leaves_while_held_leaves_the_gate(upstreams, router_factory):
    peer, router = _gated(upstreams, router_factory, dispatch="fifo", dispatch_depth=1)
    gate = router.state.routing.gate
    out: dict[str, Any] = {}
    busy = _busy(router, peer, out)
    with httpx.Client(base_url=router.url, timeout=0.5) as c, \
            contextlib.suppress(httpx.ReadTimeout):
        c.post("/generate", json={"input_ids": [5, 6, 7], "stream": True})
    _until(lambda: gate.held() == 0)
    assert router.state.totals["client_aborts"] == 1
    peer.first_chunk.set()
    busy.join(30)
    assert len(peer.requests) == 1


def test_a_held_request_is_priced_again_when_its_prefix_was_placed(upstreams, router_factory):
    """A conversation's next turn, held while its previous turn was too, is cold when it
    arrives and mostly cached once that turn has been placed: it goes before a request that is
    cheaper only on the stale price."""
    peer, router = _gated(upstreams, router_factory, policy="conductor",
                            dispatch="shortest_first", dispatch_depth=1,
                            dispatch_max_hold_s=30.0)
    gate = router.state.routing.gate
    turn1 = list(range(5, 155))
    prompts = [("busy", list(range(100, 295))), ("turn1", turn1),
               ("other", list(range(290, 130, -1))), ("turn2", turn1 + list(range(200, 220)))]
    out: dict[str, Any] = {}
    threads = []
    for i, (key, ids) in enumerate(prompts):
        threads.append(threading.Thread(target=_stream, args=(router.url, ids, out, key)))
        threads[-1].start()
        _until(lambda i=i: len(peer.requests) == 1 and gate.held() == i)
    peer.first_chunk.set()
    for t in threads:
        t.join(30)
    assert _arrival_lengths(peer) == [195, 150, 170, 160]  # turn2 before "other"



def test_round_robin_and_random_are_never_held(router_factory):
    """Their pick is a turn or a draw that moves only when a request is routed: held for the
    turn's engine, requests would wait while another engine has room. The gate is off."""
    for policy in ("round_robin", "random"):
        router = router_factory(workers=(), policy=policy, dispatch="fifo")
        assert router.state.dispatcher is None and router.state.routing.gate is None
    assert router_factory(workers=(), policy="least_load", dispatch="fifo").state.dispatcher


def test_a_pricing_error_keeps_the_last_price_and_fails_no_request(upstreams, router_factory):
    """The policy fails while a held request is priced again at the release: the request goes
    on its arrival price, and the request whose first token made the room is not failed."""
    peer, router = _gated(upstreams, router_factory, dispatch="fifo", dispatch_depth=1,
                            dispatch_timeout_s=5.0)
    gate = router.state.routing.gate
    out: dict[str, Any] = {}
    busy = _busy(router, peer, out)
    held = threading.Thread(target=_stream, args=(router.url, [5, 6, 7], out, "b"))
    held.start()
    _until(lambda: gate.held() == 1)

    def broken(*_: Any) -> Any:
        raise RuntimeError("policy bug")

    router.state.routing.estimate = broken  # type: ignore[method-assign]
    peer.first_chunk.set()
    busy.join(30)
    held.join(30)
    assert out["a"].status_code == 200 and b"error" not in out["a"].content
    assert out["b"].status_code == 200 and len(peer.requests) == 2


def test_a_held_request_asks_the_index_service_again_when_released(upstreams, router_factory):
    """With the index as a service, the matches fetched at arrival are fetched again at the
    release: the request is placed against the cache of then."""
    peer, router = _gated(upstreams, router_factory, dispatch="fifo", dispatch_depth=1)
    index = router.state.index
    asked: list[tuple[int, ...]] = []

    async def prefetch_match(namespace: Any, keys: Any) -> None:
        asked.append(tuple(keys))

    index.remote = True  # the local index, asked as a service would be
    index.prefetch_match = prefetch_match
    out: dict[str, Any] = {}
    busy = _busy(router, peer, out)
    once = len(asked)  # not held: asked once (a key set or two)
    assert once >= 1
    held = threading.Thread(target=_stream, args=(router.url, list(range(5, 40)), out, "b"))
    held.start()
    _until(lambda: router.state.routing.gate.held() == 1)
    peer.first_chunk.set()
    busy.join(30)
    held.join(30)
    assert out["b"].status_code == 200
    later = asked[once:]
    assert len(later) == 2 * once and later[:once] == later[once:]  # arrival, then release
