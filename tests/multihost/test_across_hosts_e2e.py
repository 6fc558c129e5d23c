"""radix-global across hosts, on real SGLang CPU workers (``radix_global_tools/cluster/hosts.py``
test hosts).

Hosts ``a`` and ``b`` (one worker each, each with its own shm pool), ``r`` (the router, and the
client the test speaks from) and ``i`` (a standalone index service), joined by a bridge: every
byte between the parts crosses a veth link; nothing listens on the root namespace.

1. A conversation is routed by R to the host holding its history, from the index R built out of
   A's and B's KV events over the network, and the engine's cached tokens confirm the
   prediction; the index service on I, fed by the same events, serves the same view.
2. The host holding it fails (its link down, then every process SIGKILLed: no FIN reaches
   anyone, as with a power loss) while it streams an
   answer: that stream ends with an error event, the conversation's next turn (not started yet)
   is answered by the other host and equals a cold run there, the failed worker leaves within
   the heartbeat timeout; when the host comes back its worker rejoins and its events are
   indexed again.
3. A router-only deployment: a second router on R with a plain SGLang worker on host ``s``
   on its command line (``--workers``): it finds the worker's KV events from ``/server_info``
   (SGLang's ``tcp://*:5557``, made ``tcp://<s's address>:5557``) and routes a conversation's
   second turn to its cached history.
4. The negative control of ``test_mooncake_pool_e2e.py``: a history computed on A, in A's shm
   pool, gives B no storage tokens.
One engine start-up per host for every test (the module fixture); the second test fails a host
and waits for it to rejoin, so they run in this order.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from engine_answers import greedy

from radix_global.trace import synthetic_word
from radix_global_tools.cluster.host_cluster import HostCluster, HostProc
from radix_global_tools.cluster.hosts import HostSet

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]
PAGE = 16
HEARTBEAT_TIMEOUT_S = 6.0
REPO = Path(__file__).resolve().parents[2]


class Cluster(NamedTuple):
    hosts: HostSet
    cluster: HostCluster
    router: HostProc
    index: HostProc


def text(seed: int, words: int) -> str:
    return " ".join(synthetic_word((seed * 7919 + i) % 4000) for i in range(words))


def chat(c: HostCluster, router: HostProc, messages: list[dict[str, str]],
         **extra: Any) -> httpx.Response:
    return c.request("POST", router.url + "/v1/chat/completions", timeout=240.0, json={
        "model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0, **extra})


def cached_tokens(r: httpx.Response) -> int:
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)


def greedy_reference(model_dir: str, messages: list[dict[str, str]]) -> tuple[list[int],
                                                                               list[int]]:
    """The chat prompt's token ids and HF transformers' greedy 4 tokens after it: a cold run
    (equal to SGLang's on CPU, ``tests/sglang_patch/test_sglang_server.py``)."""
    from router.keying.tokenize import TokenizerCache

    ids = TokenizerCache().get(model_dir).encode_chat(messages)  # as the router renders it
    return ids, greedy(model_dir, ids)


def index_stats(c: HostCluster, router: HostProc) -> dict[str, Any]:
    return dict(c.request("GET", router.url + "/admin/stats", admin=True).json()["index"])


def wait_stored(c: HostCluster, router: HostProc, before: int, pages: int) -> int:
    """Until R's index applied ``pages`` more stored pages than ``before`` (KV events arrive
    asynchronously, here over the network); the new count."""
    deadline = time.monotonic() + 30
    stored = before
    while time.monotonic() < deadline:
        stored = int(index_stats(c, router)["pages_stored"])
        if stored >= before + pages:
            return stored
        time.sleep(0.2)
    raise AssertionError(f"R's index stored {stored - before} new pages, not {pages}")


def index_probe(hosts: HostSet, host: str, target: str, token: str, op: dict[str, Any]
                ) -> dict[str, Any]:
    """Run ``tests/multihost/index_probe.py`` in ``host``'s namespace (gRPC's own threads make
    the connections, so the call must come from a process inside the namespace)."""
    argv = hosts.argv(host, [sys.executable, str(Path(__file__).with_name("index_probe.py")),
                             target, token, json.dumps(op)])
    done = subprocess.run(argv, capture_output=True, timeout=120, check=False, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return dict(json.loads(done.stdout))


@pytest.fixture(scope="module")
def up(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with HostSet(["a", "b", "r", "i", "s"], tmp_path_factory.mktemp("hosts")) as hosts:
        c = HostCluster(hosts, tiny_model_dir, client_host="r", page_size=PAGE)
        try:
            router = c.start_router("r", options=[
                "--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S),
                "--health-check-interval-s", "0.5", "--connect-timeout-s", "2"])
            index = c.start_index("i", heartbeat_timeout_s=600)
            workers = [c.start_worker(h, router, cores={n}) for n, h in enumerate("ab")]
            c.wait_http(workers)
            c.wait_workers(router, {"w-a", "w-b"})
            # I follows the same workers: their records as R lists them (R's registrations
            # came from A and B over the network, so they name addresses I can reach too)
            records = [{k: w[k] for k in ("worker_id", "url", "model", "namespace",
                                          "page_size", "kv_events_endpoint", "pool_id")}
                       for w in c.workers(router)]
            got = index_probe(hosts, "r", index.url, c.admin_token,
                              {"register": records})
            assert got["subscribed"] == [True, True], got
            yield Cluster(hosts, c, router, index)
        finally:
            c.close()


def test_conversation_is_routed_across_hosts_to_its_history(up: Cluster) -> None:
    c, router = up.cluster, up.router
    convs = {k: [{"role": "system", "content": text(k, 200)}] for k in (1, 2)}
    home: dict[int, str] = {}
    stored = int(index_stats(c, router)["pages_stored"])
    for turn in range(3):
        for k, messages in convs.items():
            messages.append({"role": "user", "content": text(100 * k + turn, 40)})
            r = chat(c, router, messages)
            assert r.status_code == 200, r.text
            worker = r.headers["x-radix-worker"]
            if turn == 0:
                home[k] = worker
            else:  # R predicted the history on its home, and the engine there had it cached
                assert worker == home[k], (k, turn, worker, home)
                assert int(r.headers["x-radix-prefix-tokens"]) >= 200
                assert cached_tokens(r) >= int(r.headers["x-radix-prefix-tokens"]) - PAGE
            messages.append({"role": "assistant",
                             "content": r.json()["choices"][0]["message"]["content"] or "ok"})
            usage = r.json()["usage"]
            new_pages = (usage["prompt_tokens"] - cached_tokens(r)) // PAGE
            stored = wait_stored(c, router, stored, max(1, new_pages - 1))
    # I's view of conversation 1's history: on the same worker, as long as R's prediction
    ns = next(w["namespace"] for w in c.workers(router))
    view = index_probe(up.hosts, "r", up.index.url, c.admin_token, {
        "match": {"namespace": ns, "model": str(c.model_dir), "page_size": PAGE,
                  "messages": convs[1][:-1]}})
    assert view["best_worker"] == home[1], (view, home)
    assert view["gpu_pages"][home[1]] * PAGE >= 200, view
    other = next(w for w in ("w-a", "w-b") if w != home[1])
    assert view["gpu_pages"].get(other, 0) < view["gpu_pages"][home[1]], view
    # every event stream followed over the network; a gap (the engines' warm-up published
    # before R subscribed) is replayed from the worker's replay socket on its host
    sub = index_stats(c, router)["subscriber"]
    assert sub["workers"] == 2 and sub["subscribe_failures"] == 0 and not sub["refused"], sub
    assert sub["replay_failures"] == 0 and sub["replays"] >= (1 if sub["gaps"] else 0), sub
    print(f"R's subscriber: {sub}")


def test_a_failed_host_leaves_and_rejoins_and_no_request_hangs(up: Cluster) -> None:
    hosts, c, router = up.hosts, up.cluster, up.router
    messages = [{"role": "system", "content": text(7, 200)},
                {"role": "user", "content": text(8, 40)}]
    first = chat(c, router, messages)
    assert first.status_code == 200, first.text
    victim = first.headers["x-radix-worker"]  # w-a or w-b: the history's home
    host, survivor = victim[2:], "w-b" if victim == "w-a" else "w-a"
    messages.append({"role": "assistant", "content": "ok"})
    time.sleep(1.0)  # the first turn's pages reach R's index

    # a long answer streaming from the victim when its host dies
    def stream() -> tuple[str | None, bytes]:
        body = {"model": "tiny", "messages": [*messages, {"role": "user", "content": "go"}],
                "max_tokens": 4000, "temperature": 0, "ignore_eos": True, "stream": True}
        with c._http.stream("POST", router.url + "/v1/chat/completions", json=body,
                            timeout=httpx.Timeout(120.0)) as resp:
            chunks = []
            for chunk in resp.iter_raw():
                chunks.append(chunk)
                started.set()
            return resp.headers.get("x-radix-worker"), b"".join(chunks)

    turn_ids, reference = greedy_reference(
        c.model_dir, [*messages, {"role": "user", "content": text(9, 20)}])
    started = threading.Event()
    streaming = c._client_pool.submit(stream)
    assert started.wait(120), "the stream never started"
    t_fail = time.monotonic()
    hosts.fail(host)
    c.forget(host)

    # the next turn has not started anywhere: answered by the survivor, equal to a cold run
    r = c.request("POST", router.url + "/generate", timeout=240.0, json={
        "input_ids": turn_ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert r.status_code == 200, r.text
    assert r.headers["x-radix-worker"] == survivor
    assert r.json()["output_ids"] == reference
    assert r.json()["meta_info"]["cached_tokens"] == 0  # the survivor never saw it

    # no FIN reached R (the cable went first): the stream ends when R removes the worker
    streamed_on, body = streaming.result(timeout=HEARTBEAT_TIMEOUT_S + 15)
    assert time.monotonic() - t_fail <= HEARTBEAT_TIMEOUT_S + 5
    assert streamed_on == victim
    # the router's error event, then [DONE] (router/transport/errors.py sse_error)
    assert b'"error"' in body[-1000:] and body.rstrip().endswith(b"[DONE]"), body[-500:]
    deadline = t_fail + HEARTBEAT_TIMEOUT_S + 5
    while {w["worker_id"] for w in c.workers(router)} != {survivor}:
        assert time.monotonic() < deadline, c.workers(router)
        time.sleep(0.2)
    left_after = time.monotonic() - t_fail
    assert left_after <= HEARTBEAT_TIMEOUT_S + 5

    # the host comes back: its worker rejoins, and R follows its events again
    hosts.restore(host)
    back = c.start_worker(host, router, cores={0 if host == "a" else 1})
    c.wait_http([back])
    c.wait_workers(router, {"w-a", "w-b"})
    stored = int(index_stats(c, router)["pages_stored"])
    direct = c.request("POST", back.url + "/v1/chat/completions", timeout=240.0, json={
        "model": "tiny", "messages": [{"role": "user", "content": text(11, 120)}],
        "max_tokens": 4, "temperature": 0})
    assert direct.status_code == 200, direct.text
    wait_stored(c, router, stored, 4)
    print(f"left after {left_after:.1f} s (heartbeat timeout {HEARTBEAT_TIMEOUT_S} s)")
    with contextlib.suppress(Exception):
        print(json.dumps(index_stats(c, router).get("subscriber")))


def test_router_only_in_front_of_stock_sglang_on_another_host(up: Cluster) -> None:
    hosts, c = up.hosts, up.cluster
    stock = c.start_stock_worker("s", cores={1})
    c.wait_http([stock])
    r2 = c.start_router("r", port=30081, options=[
        "--workers", stock.url, "--profile-max-tokens", "0", "--health-check-interval-s", "0.5"])
    deadline = time.monotonic() + 60
    while not (listed := c.workers(r2)):
        assert time.monotonic() < deadline, "the router did not discover the stock worker"
        time.sleep(0.5)
    assert listed[0]["kv_events_endpoint"] == f"tcp://{hosts['s'].address}:5557", listed
    messages = [{"role": "system", "content": text(21, 200)},
                {"role": "user", "content": text(22, 30)}]
    stored = int(index_stats(c, r2)["pages_stored"])
    first = chat(c, r2, messages)
    assert first.status_code == 200, first.text
    wait_stored(c, r2, stored, 200 // PAGE)
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    second = chat(c, r2, messages)
    assert second.status_code == 200, second.text
    assert int(second.headers["x-radix-prefix-tokens"]) >= 200
    assert cached_tokens(second) >= int(second.headers["x-radix-prefix-tokens"]) - PAGE


def test_a_hosts_shm_pool_is_not_loaded_by_another_host(up: Cluster) -> None:
    """The negative control of ``test_mooncake_pool_e2e.py``: with a shm pool per host, a
    history computed on A (its pages in A's pool, indexed by R) gives B no storage tokens:
    nothing of a pool crosses the hosts but the network, so the storage tokens the Mooncake test
    sees are the store's."""
    c, router = up.cluster, up.router
    url = {w["worker_id"]: w["url"] for w in c.workers(router)}
    assert set(url) == {"w-a", "w-b"}, url  # test 2's host rejoined
    first = text(41, 400)

    def generate(worker: str, prompt: str) -> dict[str, Any]:
        r = c.request("POST", url[worker] + "/generate", timeout=240.0, json={
            "text": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
        assert r.status_code == 200, r.text
        return dict(r.json()["meta_info"])

    stored = int(index_stats(c, router)["pages_stored"])
    prompt_tokens = generate("w-a", first)["prompt_tokens"]
    wait_stored(c, router, stored, 2 * (prompt_tokens // PAGE - 1))  # A's GPU tier and pool
    meta = generate("w-b", first + " " + text(42, 20))
    print("B after A computed the history:", meta)
    assert meta["cached_tokens"] == 0, meta
    assert not (meta.get("cached_tokens_details") or {}).get("storage"), meta
