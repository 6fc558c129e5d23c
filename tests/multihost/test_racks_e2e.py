"""Where hosts are (issue 44, docs/interfaces.md "Where hosts are"): two racks on test hosts, the
second behind an uplink shaped to 50 Mbit/s (below the engines' load rate, so the link is the
bottleneck), real SGLang CPU workers on one Mooncake Store.

Rack r1 holds hosts ``a`` and ``b``, rack r2 host ``c``; the master ``m`` and the router ``r``
sit on the core. Each worker registers its place; the router is told r2's uplink. A
conversation's first turn is computed on ``a`` (the only worker then), its pages written to
``a``'s segment; ``b`` and ``c`` join and ``a`` is drained. The second turn must then be served
from ``a``'s segment by ``b`` (in the rack) or ``c`` (across the slow uplink):

- places as they are: the router picks ``b`` and plans the fetch; ``b``'s engine loads the history
  from the store (storage tokens), its output equals a cold run (HF transformers), and the load
  ``b``'s backend timed reaches the router, attributed to ``a``'s segment. With ``b`` drained too,
  ``c`` alone gets a third turn priced as a recompute (the fetch across the uplink loses).
- the negative control, places swapped (``b`` registers r2, ``c`` r1): the router now picks ``c``,
  whose fetch physically crosses the slow uplink. A router that ignored places would pick the
  same worker in both runs, and one of them would fail.
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




@pytest.mark.parametrize("places", ["as_racked", "swapped"])
def test_the_router_fetches_within_the_rack_not_across_the_slow_uplink(
        places: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    from router.keying.tokenize import TokenizerCache

    tok = TokenizerCache().get(str(tiny_model_dir))
    history = [{"role": "system", "content": " ".join(synthetic_word(i * 7) for i in range(500))},
               {"role": "user", "content": "first"}]
    turn1 = tok.encode_chat(history)
    more = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "second"}]
    turn2 = tok.encode_chat(more)
    turn3 = tok.encode_chat([*more, {"role": "assistant", "content": "ok"},
                             {"role": "user", "content": "third"}])
    reference = greedy(str(tiny_model_dir), turn2)
    registered = dict(RACKS) if places == "as_racked" else {**RACKS, "b": "r2", "c": "r1"}
    expected = "w-b" if places == "as_racked" else "w-c"

    with HostSet(["a", "b", "c", "m", "r"], tmp_path, racks=RACKS) as hosts:
        c = HostCluster(hosts, tiny_model_dir, client_host="r", page_size=PAGE)
        try:
            master = c.start_mooncake_master("m")
            router = c.start_router("r", options=[
                "--profile-max-tokens", "0", "--topology-links",
                f"r2={UPLINK_MBIT * 1e6 / 8}"])

            def worker(host: str, core: int) -> HostProc:
                return c.start_worker(host, router, {core}, mooncake=master, extra=[
                    "--radix-global-place", registered[host]])

            def generate(ids: list[int]) -> tuple[str, int, dict, float]:
                started = time.monotonic()
                r = c.request("POST", router.url + "/generate", timeout=240.0, json={
                    "input_ids": ids, "sampling_params": {"max_new_tokens": 4,
                                                          "temperature": 0}})
                assert r.status_code == 200, r.text
                return (r.headers["x-radix-worker"], int(r.headers["x-radix-fetch-tokens"]),
                        r.json(), time.monotonic() - started)

            first = worker("a", 0)
            c.wait_http([first])
            c.wait_workers(router, {"w-a"})
            home, _, _, _ = generate(turn1)
            assert home == "w-a"
            want, deadline = len(turn1) // PAGE - 1, time.monotonic() + 30
            while time.monotonic() < deadline and c.request(
                    "GET", router.url + "/admin/stats", admin=True).json()["index"].get(
                    "pages_stored", 0) < want:
                time.sleep(0.5)
            others = [worker("b", 1), worker("c", 0)]
            c.wait_http(others)
            c.wait_workers(router, {"w-a", "w-b", "w-c"})
            assert c.request("POST", f"{router.url}/admin/workers/w-a/drain",
                             admin=True).status_code == 200
            hosts.shape_rack("r2", UPLINK_MBIT)

            chosen, fetch, answer, seconds = generate(turn2)
            print(f"{places}: turn 2 to {chosen}, fetch planned {fetch}, storage "
                  f"{storage(answer)} of {len(turn2)}, {seconds:.2f} s")
            assert chosen == expected
            assert fetch >= len(turn1) - 2 * PAGE  # the history, from a's segment
            assert answer["output_ids"] == reference  # equal to a cold run
            if places == "swapped":
                return
            assert storage(answer) >= len(turn1) - 2 * PAGE, answer["meta_info"]

            # b's backend timed its load and the router put it on a's segment -> b's path
            deadline, topology = time.monotonic() + 15, {}
            while time.monotonic() < deadline:
                topology = c.request("GET", router.url + "/admin/stats",
                                     admin=True).json()["topology"]
                if topology["loads"].get("applied"):
                    break
                time.sleep(0.5)
            print("topology:", topology)
            assert topology["loads"].get("applied", 0) >= 1, topology
            assert topology["placed"]["w-c"] == f"host:{hosts['c'].address}"

            # c alone: the fetch across the uplink loses to a recompute
            assert c.request("POST", f"{router.url}/admin/workers/w-b/drain",
                             admin=True).status_code == 200
            chosen, fetch, answer, seconds = generate(turn3)
            print(f"turn 3 to {chosen}, fetch planned {fetch}, storage {storage(answer)}, "
                  f"{seconds:.2f} s")
            assert chosen == "w-c" and fetch == 0
        finally:
            c.close()
