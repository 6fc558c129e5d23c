"""Where hosts are (issue 44, docs/interfaces.md "Where hosts are"): two racks on test hosts, the
second behind an uplink shaped to 50 Mbit/s (below the engines' load rate, so the link is the
bottleneck), real SGLang CPU workers on one Mooncake Store.

Rack r1 holds hosts ``a`` and ``b``, rack r2 host ``c``; the master ``m`` and the router ``r``
sit on the core. Each worker registers its place; the router is told r2's uplink. The first turn
of two conversations, X and Y, is computed on ``a`` (the only worker then), their pages written to
``a``'s segment; ``b`` and ``c`` join and ``a`` is drained. A second turn must then be served from
``a``'s segment by ``b`` (in the rack) or ``c`` (across the slow uplink):

- places as they are: the router picks ``b`` for X and plans the fetch; ``b``'s engine loads the
  history from the store (storage tokens), its output equals a cold run (HF transformers), and
  the load ``b``'s backend timed reaches the router, attributed to ``a``'s segment. With ``b``
  drained too, ``c`` alone gets a third turn priced as a recompute (the fetch across the uplink
  loses).
- the negative control, places swapped: ``b`` and ``c`` restart, ``b`` registering r2 and ``c``
  r1. The router now picks ``c`` for Y, whose fetch physically crosses the slow uplink. A router
  that ignored places would pick the same worker both times, and one of them would fail. (One
  cluster for both: the restart of two engines costs less than a second cluster.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from engine_answers import greedy, storage

from radix_global.trace import synthetic_word
from radix_global_tools.cluster.host_cluster import HostCluster, HostProc
from radix_global_tools.cluster.hosts import HostSet

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]
PAGE = 16
UPLINK_MBIT = 50  # 6.25 MB/s
RACKS = {"a": "r1", "b": "r1", "c": "r2"}


def test_the_router_fetches_within_the_rack_not_across_the_slow_uplink(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    from router.keying.tokenize import TokenizerCache

    tok = TokenizerCache().get(str(tiny_model_dir))

    def turns(seed: int) -> list[list[int]]:
        chat = [{"role": "system", "content": " ".join(
            synthetic_word(seed + i * 7) for i in range(500))}]
        out = []
        for n, question in enumerate(["first", "second", "third"]):
            if n:
                chat.append({"role": "assistant", "content": "ok"})
            chat.append({"role": "user", "content": question})
            out.append(tok.encode_chat(chat))
        return out

    x, y = turns(0), turns(3)
    references = {"x": greedy(str(tiny_model_dir), x[1]), "y": greedy(str(tiny_model_dir), y[1])}

    with HostSet(["a", "b", "c", "m", "r"], tmp_path, racks=RACKS) as hosts:
        c = HostCluster(hosts, tiny_model_dir, client_host="r", page_size=PAGE)
        try:
            master = c.start_mooncake_master("m")
            router = c.start_router("r", options=[
                "--profile-max-tokens", "0", "--topology-links",
                f"r2={UPLINK_MBIT * 1e6 / 8}"])

            def worker(host: str, core: int, rack: str) -> HostProc:
                return c.start_worker(host, router, {core}, mooncake=master, extra=[
                    "--radix-global-place", rack])

            def stats() -> dict:
                return dict(c.request("GET", router.url + "/admin/stats", admin=True).json())

            def drain(worker_id: str) -> None:
                assert c.request("POST", f"{router.url}/admin/workers/{worker_id}/drain",
                                 admin=True).status_code == 200

            def generate(ids: list[int]) -> tuple[str, int, dict, float]:
                started = time.monotonic()
                r = c.request("POST", router.url + "/generate", timeout=240.0, json={
                    "input_ids": ids, "sampling_params": {"max_new_tokens": 4,
                                                          "temperature": 0}})
                assert r.status_code == 200, r.text
                return (r.headers["x-radix-worker"], int(r.headers["x-radix-fetch-tokens"]),
                        r.json(), time.monotonic() - started)

            def second_turn(ids: list[int], reference: list[int], label: str) -> str:
                chosen, fetch, answer, seconds = generate(ids)
                print(f"{label}: turn 2 to {chosen}, fetch planned {fetch}, storage "
                      f"{storage(answer)} of {len(ids)}, {seconds:.2f} s")
                assert fetch >= len(ids) - 3 * PAGE  # the history, from a's segment
                assert answer["output_ids"] == reference  # equal to a cold run
                return chosen

            first = worker("a", 0, "r1")
            c.wait_http([first])
            c.wait_workers(router, {"w-a"})
            assert generate(x[0])[0] == generate(y[0])[0] == "w-a"
            want, deadline = (len(x[0]) + len(y[0])) // PAGE - 2, time.monotonic() + 30
            while time.monotonic() < deadline and stats()["index"].get("pages_stored", 0) < want:
                time.sleep(0.5)
            others = [worker("b", 1, "r1"), worker("c", 0, "r2")]
            c.wait_http(others)
            c.wait_workers(router, {"w-a", "w-b", "w-c"})
            drain("w-a")
            hosts.shape_rack("r2", UPLINK_MBIT)

            assert second_turn(x[1], references["x"], "as racked") == "w-b"
            # b's backend timed its load and the router put it on a's segment -> b's path
            deadline, topology = time.monotonic() + 15, {}
            while time.monotonic() < deadline:
                topology = stats()["topology"]
                if topology["loads"].get("applied"):
                    break
                time.sleep(0.5)
            print("topology:", topology)
            assert topology["loads"].get("applied", 0) >= 1, topology
            assert topology["placed"]["w-c"] == f"host:{hosts['c'].address}"

            # c alone: the fetch across the uplink loses to a recompute
            drain("w-b")
            chosen, fetch, answer, seconds = generate(x[2])
            print(f"turn 3 to {chosen}, fetch planned {fetch}, storage {storage(answer)}, "
                  f"{seconds:.2f} s")
            assert chosen == "w-c" and fetch == 0

            # the negative control: b and c come back with their places swapped
            for proc in others:
                c.stop(proc)
            others = [worker("b", 1, "r2"), worker("c", 0, "r1")]
            c.wait_http(others)
            deadline = time.monotonic() + 60  # until both registered again, places swapped
            while {(w["worker_id"], w["place"], w["draining"]) for w in c.workers(router)} != {
                    ("w-a", "r1", True), ("w-b", "r2", False), ("w-c", "r1", False)}:
                assert time.monotonic() < deadline, c.workers(router)
                time.sleep(0.5)
            assert second_turn(y[1], references["y"], "swapped") == "w-c"
        finally:
            c.close()
