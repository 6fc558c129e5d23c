"""Hostile input against admission and the dispatch gate (issue 35, items 2, 4 and 5), through
the router's HTTP front end, in front of a peer worker whose first chunk waits until the test
lets it go (an engine busy prefilling).

The mass disconnect runs the real router as its own process (``radix-global router``), the
1,000 held clients in another and the ``/health`` prober in a third, so that the router's event
loop, not the test's threads, is what ``/health`` measures; the clients' process is SIGKILLed,
so every connection closes at once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from waits import until

from sglang_patch.ports import free_port

_until = partial(until, what="the condition", timeout_s=30.0, every_s=0.02)

REPO = Path(__file__).resolve().parents[3]


def _busy_peer(upstreams: Any) -> tuple[Any, Any]:
    peer, server = upstreams()
    peer.first_chunk = threading.Event()
    return peer, server


def _stream_in_thread(url: str, ids: list[int], out: dict[str, Any], key: str,
                      **extra: Any) -> threading.Thread:
    def run() -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            out[key] = c.post("/generate", json={"input_ids": ids, "stream": True, **extra})

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_client_cannot_loosen_the_operators_slo(upstreams, router_factory):
    """Item 2: with the operator's SLO, a request's own looser ``ttft_slo_s`` is refused as
    one without it (it was admitted: 30 x 200 against 26 x 429 in the probe); a stricter one
    applies."""
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), policy="conductor", ttft_slo_s=1e-6)
    router.wait_workers(1)
    ids = list(range(5, 60))
    with router.client() as c:
        for extra in ({}, {"ttft_slo_s": 1e9}, {"ttft_slo_s": 1e-9}):
            r = c.post("/generate", json={"input_ids": ids, **extra})
            assert r.status_code == 429, (extra, r.text)
            assert "ttft_slo" in r.json()["error"]["message"]
    assert peer.requests == []
    # control: without the operator's SLO the same requests run
    loose = router_factory(workers=(server.url,), policy="conductor")
    loose.wait_workers(1)
    with loose.client() as c:
        assert c.post("/generate", json={"input_ids": ids, "ttft_slo_s": 1e9}).status_code == 200


def test_only_a_stream_is_admitted_as_a_ttft_probe(upstreams, router_factory):
    """A whole answer's first token is never seen: with every would-be rejection a probe, the
    stream is served and the whole answer is still refused."""
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), policy="conductor", ttft_slo_s=1e-6,
                            ttft_probe_every=1)
    router.wait_workers(1)
    with router.client() as c:
        assert c.post("/generate", json={"input_ids": [5, 6, 7], "stream": True}
                      ).status_code == 200
        assert c.post("/generate", json={"input_ids": [5, 6, 7]}).status_code == 429
    assert len(peer.requests) == 1


def test_a_full_held_queue_answers_503_at_once(upstreams, router_factory):
    """Item 5: the held queue is bounded by count and by body bytes; beyond, 503 with
    Retry-After at once, and the refused request never reaches the engine."""
    peer, server = _busy_peer(upstreams)
    router = router_factory(workers=(server.url,), policy="least_load", dispatch_depth=1,
                            dispatch_max_held=2, dispatch_max_held_bytes=100_000)
    router.wait_workers(1)
    dispatcher = router.state.dispatcher
    out: dict[str, Any] = {}
    threads = [_stream_in_thread(router.url, list(range(5, 50)), out, "busy")]
    _until(lambda: len(peer.requests) == 1)
    threads += [_stream_in_thread(router.url, [5, 6, 7, i], out, f"held{i}") for i in range(2)]
    _until(lambda: dispatcher.gate.held() == 2)
    with router.client() as c:
        t0 = time.monotonic()
        r = c.post("/generate", json={"input_ids": [5, 6, 7], "stream": True})
        assert time.monotonic() - t0 < 2.0
        assert r.status_code == 503 and "held queue is full" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1
        # by bytes: one held request of 60 kB, and the next of 60 kB does not fit in 100 kB
        peer.first_chunk.set()
        for t in threads:
            t.join(30)
        assert all(out[k].status_code == 200 for k in ("busy", "held0", "held1"))
        peer.first_chunk.clear()
        pad = {"pad": "x" * 60_000}
        threads = [_stream_in_thread(router.url, list(range(5, 50)), out, "busy2")]
        _until(lambda: len(peer.requests) == 4)
        threads.append(_stream_in_thread(router.url, [5, 6, 8], out, "big", **pad))
        _until(lambda: dispatcher.gate.held() == 1)
        assert 60_000 < dispatcher.held_bytes < 100_000
        r = c.post("/generate", json={"input_ids": [5, 6, 9], "stream": True, **pad})
        assert r.status_code == 503 and "bytes held" in r.json()["error"]["message"]
    peer.first_chunk.set()
    for t in threads:
        t.join(30)
    assert out["big"].status_code == 200 and len(peer.requests) == 5
    assert dispatcher.held_bytes == 0 and router.state.totals["held_queue_full"] == 2


def test_a_token_id_body_is_bounded_by_the_models_context(upstreams, router_factory):
    """Item 5: a token-id prompt whose body could not fit the context (here: junk beside a short
    prompt) is refused before it is held, as a text prompt's was (the peer's context: 512
    tokens, so 512 x 32 bytes + 256 KiB)."""
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), policy="least_load")
    router.wait_workers(1)
    with router.client() as c:
        r = c.post("/generate", json={"input_ids": [5, 6, 7], "junk": "x" * 300_000})
        assert r.status_code == 400 and "context length" in r.json()["error"]["message"]
        ok = c.post("/generate", json={"input_ids": [5, 6, 7], "junk": "x" * 200_000})
        assert ok.status_code == 200
    assert len(peer.requests) == 1


# The held clients: N connections, each a streaming /generate, then wait to be killed.
_CLIENTS = textwrap.dedent("""
    import asyncio, json, sys
    port, n = int(sys.argv[1]), int(sys.argv[2])
    async def main():
        conns = []
        for i in range(n):
            body = json.dumps({"input_ids": [5, 6, 7, 8 + i % 200], "stream": True}).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /generate HTTP/1.1\\r\\nhost: x\\r\\ncontent-type: "
                         b"application/json\\r\\ncontent-length: %d\\r\\n\\r\\n" % len(body) + body)
            conns.append(writer)
            if i % 100 == 99:
                await asyncio.sleep(0.05)
        print("sent", flush=True)
        await asyncio.sleep(300)
    asyncio.run(main())
""")


# /health every 10 ms for a while, from a process of its own (the test process's threads and
# garbage collections would be measured too); prints the slowest answer in seconds.
_HEALTH = textwrap.dedent("""
    import sys, time, httpx
    base, duration = sys.argv[1], float(sys.argv[2])
    worst, end = 0.0, time.monotonic() + duration
    with httpx.Client(base_url=base, timeout=10) as h:
        h.get("/health")  # connected: the test goes on when it reads this line
        print("ready", flush=True)
        while time.monotonic() < end:
            t0 = time.monotonic()
            assert h.get("/health").status_code == 200
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.01)
    print(worst)
""")


def _metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


HELD = 1000
RSS_BOUND_MB = 64  # what holding HELD small requests may add to the router (measured: 17 MB)


@pytest.mark.timeout(180)
def test_a_thousand_held_clients_leaving_at_once(upstreams, tmp_path):
    """Item 4: 1,000 held clients close their connections at once while the engine makes room.
    ``/health`` answers within 100 ms throughout (it stalled for 13 s), no request whose client
    the router knew was gone reaches the engine, the held queue empties, and holding them cost
    the router less than ``RSS_BOUND_MB``."""
    peer, server = _busy_peer(upstreams)
    port = free_port()
    log = tmp_path / "router.log"
    argv = [sys.executable, "-m", "radix_global_cli", "router", "--host", "127.0.0.1",
            "--port", str(port), "--workers", server.url, "--policy", "least_load",
            "--dispatch-depth", "1", "--profile-max-tokens", "0", "--log-level", "warning"]
    with open(log, "wb") as fh:
        router = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO),
                                  start_new_session=True)
    clients: subprocess.Popen[str] | None = None
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=10) as c:
            _until(lambda: _workers(c) == 1, timeout_s=60)
            # a text prompt: the tokenizer (transformers) is loaded before memory is measured
            assert c.post("/generate", json={"text": "hello world"}, timeout=60).status_code == 200
            peer.requests.clear()
            out: dict[str, Any] = {}
            busy = _stream_in_thread(base, list(range(5, 50)), out, "busy")
            _until(lambda: len(peer.requests) == 1)
            rss0 = _rss_mb(router.pid)
            clients = subprocess.Popen([sys.executable, "-c", _CLIENTS, str(port), str(HELD)],
                                       stdout=subprocess.PIPE, text=True)
            _until(lambda: _metric(c, "radix_global_dispatch_held_requests") == HELD, timeout_s=60)
            grown = _rss_mb(router.pid) - rss0
            watcher = subprocess.Popen([sys.executable, "-c", _HEALTH, base, "4.0"],
                                       stdout=subprocess.PIPE, text=True)
            assert watcher.stdout is not None and watcher.stdout.readline() == "ready\n"
            time.sleep(0.2)
            clients.send_signal(signal.SIGKILL)  # every connection closes at once ...
            peer.first_chunk.set()  # ... as the engine makes room
            _until(lambda: _metric(c, "radix_global_dispatch_held_requests") == 0, timeout_s=30)
            worst = float(watcher.communicate(timeout=30)[0].split()[-1])
            busy.join(30)
        print(f"held {HELD}: router RSS +{grown:.0f} MB; worst /health {worst * 1000:.0f} ms;"
              f" engine requests {len(peer.requests)}")
        assert out["busy"].status_code == 200
        # A request released as its client's connection closed, before the router read the
        # close, may reach the engine; it is aborted at once (or, when the engine's whole answer
        # had been relayed by then, booked as answered: nothing is left to abort), and the room
        # it took does not pass on to the next dead one (a chain through the held queue, before).
        raced = [body["rid"] for _, body in peer.requests[1:]]
        assert len(raced) <= 2, f"{len(raced)} disconnected requests were routed"

        def settled() -> bool:
            recent = httpx.get(f"{base}/admin/stats", timeout=10).json()["recent"]
            answered = {r["request_id"] for r in recent if r.get("ok")}
            return set(raced) <= set(peer.aborted) | answered

        _until(settled)
        assert worst < 0.1, f"/health took {worst:.3f} s"
        assert grown < RSS_BOUND_MB, f"holding {HELD} grew the router by {grown:.0f} MB"
    finally:
        if clients is not None and clients.poll() is None:
            clients.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(router.pid, signal.SIGTERM)
        router.wait(30)


def _workers(c: httpx.Client) -> int:
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        return len(c.get("/admin/workers").json()["workers"])
    return 0
