"""Several routers, one view, on real SGLang CPU workers (``docs/interfaces.md``, "Several
routers, one view"; ``radix_global_tools/cluster/hosts.py`` test hosts).

Hosts ``a`` and ``b`` (one worker each), ``p`` and ``q`` (a router each), ``k`` (the Redis
both routers share, started here; the client speaks from ``k`` too). The workers are given both
routers (``--radix-global http://p,http://q``): they register once, with ``p``.

1. Both routers route to the workers registered once; a router not sharing the view (another
   cluster name on the same Redis: the negative control) has no worker at all.
2. A conversation whose turns alternate between the routers lands where its history is cached
   (the engine's cached tokens and the routers' predictions agree).
3. A burst of long streaming prompts split across both routers: with the shared load view each
   engine gets about the dispatch depth of prefills at once (as one router alone would allow;
   plus a publication in flight and the sampling's slack), fewer than both routers restarted
   with the load view off (``--coordination-unshared-load``: the negative control), which book
   the engines twice over. The restarted routers know the workers at once, from the service.
4. A router killed -9 during a replay: requests retried on the other router by the client all
   succeed; restarted, the router is ready at once and routes a conversation to its holder.
5. The coordination service killed -9 and restarted (empty) during a replay: no request fails,
   and the routers write their records back.
One engine start-up per worker host for the module.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import httpx
import pytest
import redis

from radix_global.trace import synthetic_word
from radix_global_tools.cluster.host_cluster import HostCluster, HostProc
from radix_global_tools.cluster.hosts import HostSet
from radix_global_tools.cluster.netns import netns_executor

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]
PAGE = 16
REDIS_PORT = 6379
DEPTH = 2  # the dispatch gate's depth (its default)


class Up(NamedTuple):
    hosts: HostSet
    c: HostCluster
    redis_url: str
    redis: list[subprocess.Popen[bytes]]  # the service's process (replaced when restarted)


def text(seed: int, words: int) -> str:
    return " ".join(synthetic_word((seed * 7919 + i) % 4000) for i in range(words))


def router_options(redis_url: str, name: str, *extra: str) -> list[str]:
    return ["--coordination", redis_url, "--coordination-router-id", name,
            "--coordination-resync-s", "0.5", "--heartbeat-timeout-s", "8",
            "--health-check-interval-s", "0.5", "--connect-timeout-s", "2", *extra]


def chat(c: HostCluster, router: HostProc, messages: list[dict[str, str]],
         **extra: Any) -> httpx.Response:
    return c.request("POST", router.url + "/v1/chat/completions", timeout=240.0, json={
        "model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0, **extra})


def cached_tokens(r: httpx.Response) -> int:
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)


def routers(c: HostCluster) -> dict[str, HostProc]:
    return {p.host: p for p in c.procs if p.name.startswith("router")}


def start_routers(c: HostCluster, redis_url: str, *extra: str) -> dict[str, HostProc]:
    for host in "pq":
        c.start_router(host, options=router_options(redis_url, host, *extra))
    return routers(c)


def ready(c: HostCluster, router: HostProc) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return c.request("GET", router.url + "/ready", timeout=5).status_code == 200
    return False


@pytest.fixture(scope="module")
def up(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is missing: scripts/bootstrap.sh installs it")
    with HostSet(["a", "b", "p", "q", "k"], tmp_path_factory.mktemp("hosts")) as hosts:
        c = HostCluster(hosts, tiny_model_dir, client_host="k", page_size=PAGE)
        address = hosts["k"].address
        try:
            service = [start_redis(hosts)]
            c.call(wait_redis, address)
            url = f"redis://{address}:{REDIS_PORT}/0"
            r = start_routers(c, url)
            both = SimpleNamespace(url=f"{r['p'].url},{r['q'].url}")
            workers = [c.start_worker(h, both, cores={n}) for n, h in enumerate("ab")]
            c.wait_http(workers)
            c.wait_workers(r["p"], {"w-a", "w-b"})
            yield Up(hosts, c, url, service)
        finally:
            c.close()


def start_redis(hosts: HostSet) -> subprocess.Popen[bytes]:
    """Redis on ``k``, no persistence (a restart comes back empty)."""
    return hosts.spawn("k", "redis", [
        "redis-server", "--bind", hosts["k"].address, "--port", str(REDIS_PORT), "--save", "",
        "--appendonly", "no", "--protected-mode", "no"])


def wait_redis(host: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            redis.Redis(host=host, port=REDIS_PORT, socket_timeout=1).ping()
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_both_routers_route_to_workers_registered_once(up: Up) -> None:
    c, r = up.c, routers(up.c)
    c.wait_workers(r["q"], {"w-a", "w-b"}, timeout_s=30)  # registered with p only
    for name in "pq":
        assert ready(c, r[name])
        got = chat(c, r[name], [{"role": "user", "content": text(900 + ord(name), 20)}])
        assert got.status_code == 200, got.text
    # negative control: a router of another cluster on the same service sees no worker
    alone = c.start_router("k", port=30090, options=router_options(
        up.redis_url, "alone", "--coordination-cluster", "elsewhere"))
    try:
        assert not ready(c, alone)
        assert chat(c, alone, [{"role": "user", "content": "hi"}]).status_code == 503
    finally:
        c.stop(alone)


def test_a_conversation_alternating_between_routers_finds_its_history(up: Up) -> None:
    c, r = up.c, routers(up.c)
    messages = [{"role": "user", "content": text(1, 120)}]
    holder = None
    for turn, name in enumerate("pqpq"):
        if turn:
            # a turn's think time: the previous answer's KV events (sent as the engine caches
            # the finished request) reach the other router's index a moment after the answer,
            # and only the router that routed a turn remembers where it went before they do
            time.sleep(0.3)
        got = chat(c, r[name], messages)
        assert got.status_code == 200, got.text
        worker = got.headers["x-radix-worker"]
        if turn == 0:
            holder = worker
        else:  # the other router knew where the history is, and the engine agrees
            assert worker == holder, (turn, name)
            predicted = int(got.headers["x-radix-prefix-tokens"])
            assert predicted > 0 and cached_tokens(got) >= predicted - PAGE, \
                (turn, predicted, cached_tokens(got))
        messages += [{"role": "assistant", "content": got.json()["choices"][0]["message"]
                      ["content"]}, {"role": "user", "content": text(100 + turn, 30)}]


def burst_peak(c: HostCluster, r: dict[str, HostProc], seed: int, n: int = 16
               ) -> tuple[dict[str, int], float]:
    """Send ``n`` long streaming prompts, half through each router, at once; the peak, per
    engine, of the prefills both routers together have sent it (each router's ``/admin/stats``
    ``prefilling``: sent, no first token back; summed), and the over-booking: the mean over the
    samples of the prefills beyond ``DEPTH`` summed over the engines,
    sampled from a thread of its own in the client host (the client's threads are all busy
    sending). What the routers booked, not the engine's ``/v1/loads``: SGLang writes that
    snapshot every 15 scheduler iterations, too rarely to see a burst's peak."""
    peak, stop = {"w-a": 0, "w-b": 0}, threading.Event()
    excess: list[int] = []
    auth = {"Authorization": f"Bearer {c.admin_token}"}

    def sample() -> int:
        polls = 0
        with httpx.Client(timeout=2.0, headers=auth) as http:
            while not stop.is_set():
                booked = dict.fromkeys(peak, 0)
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    for router in r.values():
                        for w in http.get(router.url + "/admin/stats").json()["workers"]:
                            booked[w["worker_id"]] += w["prefilling"]
                    polls += 1
                for w, n_booked in booked.items():
                    peak[w] = max(peak[w], n_booked)
                excess.append(sum(max(0, b - DEPTH) for b in booked.values()))
        return polls

    def one(i: int) -> int:
        body = {"model": "tiny", "messages": [{"role": "user", "content": text(seed + i, 900)}],
                "max_tokens": 1, "temperature": 0, "stream": True}
        with httpx.Client(timeout=240.0) as http:
            return http.post(r["pq"[i % 2]].url + "/v1/chat/completions", json=body).status_code

    sampler = netns_executor(c.hosts["k"].netns, workers=1)
    clients = netns_executor(c.hosts["k"].netns, workers=n)  # every request in flight at once
    polls = sampler.submit(sample)
    try:
        codes = [f.result(300) for f in [clients.submit(one, i) for i in range(n)]]
    finally:
        stop.set()
        assert polls.result(30) > 20  # the engines were watched throughout
        sampler.shutdown()
        clients.shutdown()
    assert codes == [200] * n, codes
    return peak, sum(excess) / len(excess)


def peaks(c: HostCluster, r: dict[str, HostProc], seed: int) -> tuple[dict[str, int], float]:
    """The larger of two bursts' peaks per worker, and their mean over-booking."""
    (first, e1), (second, e2) = burst_peak(c, r, seed), burst_peak(c, r, seed + 100)
    return {h: max(first[h], second[h]) for h in first}, (e1 + e2) / 2


def test_a_burst_across_both_routers_books_each_engine_once(up: Up) -> None:
    c = up.c
    shared, shared_excess = peaks(c, routers(c), seed=5000)
    # negative control: the same routers restarted with the load view off (neither publishes
    # its work): each books the engines as if it were alone
    for proc in routers(c).values():
        c.stop(proc)
    r = start_routers(c, up.redis_url, "--coordination-unshared-load")
    try:
        for name in "pq":  # warm at once: the workers from the service, no re-registration
            c.wait_workers(r[name], {"w-a", "w-b"}, timeout_s=20)
        alone, alone_excess = peaks(c, r, seed=6000)
    finally:
        for proc in routers(c).values():
            c.stop(proc)
        start_routers(c, up.redis_url)
    print(f"peak booked prefills per worker: shared view {shared}, load view off {alone}; "
          f"over-booking {shared_excess:.2f} vs {alone_excess:.2f}")
    # one router alone lets DEPTH prefills into an engine; shared, the two together do (one
    # more from a publication in flight, one more from reading the two routers one after the
    # other); unshared, each books DEPTH there (seen: shared 3/3 and 4/3, unshared 4/5, 5/4).
    # Both may peak alike in the burst's first milliseconds, before either router published:
    # the over-booking over the whole burst is what the shared view removes (seen: 4/4 peaks
    # both ways in one CI run, so the peaks alone are no negative control). Seen: 0.31 and
    # 0.35 vs 2.69 and 3.43 since the gates share a server's depth fairly and route a released
    # request where it was released to; 0.72-1.57 vs 2.5-3.0 before (CI failed at 1.57).
    assert max(shared.values()) <= DEPTH + 2, shared
    assert alone_excess > 2 * shared_excess, (alone_excess, shared_excess)


class Replay:
    """Conversations' turns from the client host, each sent to one router and retried on the
    other when that one does not answer (what a load balancer does); bounded in count."""

    def __init__(self, c: HostCluster, first: str = "p") -> None:
        self.c, self.first = c, first
        self.ok = self.failed = self.retried = 0
        self.stop = threading.Event()
        self.errors: list[str] = []

    def send(self, i: int) -> None:
        r = routers(self.c)
        order = ["p", "q"] if i % 2 == 0 else ["q", "p"]
        for attempt, name in enumerate(order):
            if name not in r:
                continue
            try:
                got = chat(self.c, r[name], [{"role": "user", "content": text(7000 + i, 40)}])
            except httpx.TransportError as exc:
                self.retried += 1
                self.errors.append(f"{name}: {exc!r}")
                continue
            if got.status_code == 200:
                self.ok += 1
                return
            self.errors.append(f"{name}: HTTP {got.status_code} {got.text[:200]}")
            if attempt == 0 and got.status_code in (502, 503):
                continue
            break
        self.failed += 1

    def run(self, max_requests: int = 400) -> threading.Thread:
        def loop() -> None:
            for i in range(max_requests):
                if self.stop.is_set():
                    return
                self.send(i)

        thread = threading.Thread(target=loop)
        thread.start()
        return thread


def test_a_router_killed_during_a_replay_loses_nothing_retried(up: Up) -> None:
    c = up.c
    messages = [{"role": "user", "content": text(31, 120)}]  # started before the kill
    first = chat(c, routers(c)["p"], messages)
    assert first.status_code == 200, first.text
    replay = Replay(c)
    thread = replay.run()
    try:
        time.sleep(3)
        q = routers(c)["q"]
        q.popen.kill()  # -9: no goodbye to the service or the clients
        q.popen.wait(10)
        c.procs.remove(q)
        time.sleep(3)
        restarted = c.start_router("q", options=router_options(up.redis_url, "q"))
        deadline = time.monotonic() + 10
        while not ready(c, restarted):  # ready from the service's view, at once
            assert time.monotonic() < deadline, restarted.log_tail()
            time.sleep(0.1)
        time.sleep(2)
    finally:
        replay.stop.set()
        thread.join(120)
    assert replay.failed == 0 and replay.ok > 10, replay.errors[-5:]
    # restarted, it routes a conversation that began before it died to its history holder (its
    # index rebuilt from the engines' event replay when it subscribed)
    messages += [{"role": "assistant", "content": first.json()["choices"][0]["message"]
                  ["content"]}, {"role": "user", "content": "more"}]
    second = chat(c, routers(c)["q"], messages)
    assert second.headers["x-radix-worker"] == first.headers["x-radix-worker"]
    assert int(second.headers["x-radix-prefix-tokens"]) > 0 and cached_tokens(second) > 0


def test_the_coordination_service_down_and_back_fails_no_request(up: Up) -> None:
    c, address = up.c, up.hosts["k"].address
    server = up.redis[0]
    replay = Replay(c)
    thread = replay.run()
    try:
        time.sleep(2)
        server.kill()
        server.wait(10)
        time.sleep(4)  # routers degraded, routing on their last view
        stats = c.request("GET", routers(c)["p"].url + "/admin/stats", admin=True).json()
        assert stats["coordination"]["degraded"], stats["coordination"]
        up.redis[0] = start_redis(up.hosts)
        c.call(wait_redis, address)
        time.sleep(4)
    finally:
        replay.stop.set()
        thread.join(120)
    assert replay.failed == 0 and replay.ok > 10, replay.errors[-5:]
    client = c.call(lambda: redis.Redis(host=address, port=REDIS_PORT, socket_timeout=2))
    keys = c.call(lambda: sorted(k.decode() for k in client.keys("rg:default:worker:*")))
    assert keys == ["rg:default:worker:w-a", "rg:default:worker:w-b"]  # written back
    for proc in routers(c).values():
        stats = c.request("GET", proc.url + "/admin/stats", admin=True).json()
        assert not stats["coordination"]["degraded"]
