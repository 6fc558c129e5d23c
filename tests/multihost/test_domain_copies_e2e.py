"""Hot prefixes across fault domains (issue 44; docs/interfaces.md, "Where hosts are", "Copies
across fault domains"): a rack fails and its hot prompt is still loaded from the pool in the
other rack, on real SGLang CPU workers over one Mooncake Store.

Host ``a`` (rack r1) and host ``c`` (rack r2) each run a worker; ``m`` the master and ``r`` the
router sit on the core. Two system prompts, P1 (hotter: 5 requests) and P2 (2), are served by
``a`` alone (``c`` joins later, and serves neither before the failure), so their pages sit in
``a``'s segment only. The router's copy rounds order P1 into ``c``'s segment; the copy budget
(``--copies-max-pages``) is P1's length and one page, so exactly one copy is ordered and P2
has none: the negative control, in the same run. Rack r1 fails (host ``a``: processes killed,
cable out). Then a new turn of each prompt goes to ``c``: P1's prefix is loaded from ``c``'s
own segment (storage tokens), its output equal to a cold run (HF transformers); P2's is
recomputed. Then rack r1 returns with an empty segment: c's copy, P1's only holder now, stops
counting against the budget, and a second copy is ordered into r1 and made (held).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from engine_answers import greedy, storage

from radix_global.trace import synthetic_word
from radix_global_tools.cluster.host_cluster import HostCluster, HostProc
from radix_global_tools.cluster.hosts import HostSet

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]
PAGE = 16




def common_pages(prompts: list[list[int]]) -> int:
    n = 0
    while all(len(p) > n for p in prompts) and len({p[n] for p in prompts}) == 1:
        n += 1
    return n // PAGE


def test_a_hot_prompt_survives_its_racks_failure_through_its_copy(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    from router.keying.tokenize import TokenizerCache

    tok = TokenizerCache().get(str(tiny_model_dir))

    def turn(seed: int, question: str) -> list[int]:
        system = " ".join(synthetic_word(seed + i * 17) for i in range(400))
        return tok.encode_chat([{"role": "system", "content": system},
                                {"role": "user", "content": question}])

    p1 = [turn(1, f"question {i}") for i in range(5)]
    p2 = [turn(2, f"question {i}") for i in range(2)]
    after = {1: turn(1, "after the failure"), 2: turn(2, "after the failure")}
    references = {k: greedy(str(tiny_model_dir), ids) for k, ids in after.items()}
    budget = common_pages(p1)
    assert common_pages(p2) > 0 and budget > 2

    with HostSet(["a", "c", "m", "r"], tmp_path, racks={"a": "r1", "c": "r2"}) as hosts:
        c = HostCluster(hosts, tiny_model_dir, client_host="r", page_size=PAGE)
        try:
            master = c.start_mooncake_master("m")
            router = c.start_router("r", options=[
                "--profile-max-tokens", "0", "--heartbeat-timeout-s", "4",
                "--health-check-interval-s", "0.5", "--copies-interval-s", "1",
                "--copies-min-hit-rate-per-s", "0.001",
                # P1's prompt and one page: after the failure its hot run is the prompt and
                # the first page of the turn c served (P2 stays over the budget throughout)
                "--copies-max-pages", str(budget + 1)])

            def worker(host: str, core: int, rack: str) -> HostProc:
                return c.start_worker(host, router, {core}, mooncake=master,
                                      extra=["--radix-global-place", rack])

            def stats() -> dict:
                return dict(c.request("GET", router.url + "/admin/stats", admin=True).json())

            def generate(ids: list[int]) -> tuple[str, dict]:
                r = c.request("POST", router.url + "/generate", timeout=240.0, json={
                    "input_ids": ids, "sampling_params": {"max_new_tokens": 4,
                                                          "temperature": 0}})
                assert r.status_code == 200, r.text
                return r.headers["x-radix-worker"], r.json()

            first = worker("a", 0, "r1")
            c.wait_http([first])
            c.wait_workers(router, {"w-a"})
            for ids in [*p1, *p2]:  # a alone: every page lands in a's segment
                assert generate(ids)[0] == "w-a"
            second = worker("c", 1, "r2")
            c.wait_http([second])
            c.wait_workers(router, {"w-a", "w-c"})
            deadline = time.monotonic() + 60
            while not stats()["copies"]["held"]:  # the index shows c's segment holding P1
                assert time.monotonic() < deadline, stats()["copies"]
                time.sleep(1.0)
            copies = stats()["copies"]
            print("copies:", copies)
            assert copies["outcomes"].get("ordered") == 1, copies

            hosts.fail("a")  # rack r1 is gone
            failed = time.monotonic()
            c.forget("a")
            deadline = time.monotonic() + 30
            while {w["worker_id"] for w in c.workers(router)} != {"w-c"}:
                assert time.monotonic() < deadline, c.workers(router)
                time.sleep(0.3)
            # removed as dead: the router tells c's backend that a's host is lost
            (pool,) = [w["pool_id"] for w in c.workers(router)]
            told = c.request("GET", router.url + "/admin/pool-copies", admin=True,
                             params={"pool_id": pool}).json()["lost_hosts"]
            assert told == [hosts["a"].address], told
            # Mooncake's master forgets a's replicas after its client TTL (10 s): before, a read
            # may pick the dead one (the router's removal takes about as long)
            time.sleep(max(0.0, failed + 15.0 - time.monotonic()))
            got = {}
            for k, ids in after.items():
                chosen, answer = generate(ids)
                got[k] = storage(answer)
                print(f"P{k} after the failure: {chosen}, storage {got[k]} of {len(ids)}",
                      answer["meta_info"].get("cached_tokens_details"))
                assert chosen == "w-c" and answer["output_ids"] == references[k]
            assert got[1] >= (budget - 1) * PAGE  # from c's own segment: the copy
            assert got[2] == 0  # no copy (over the budget): recomputed

            # rack r1 returns, empty. c's copy of P1 is P1's only holder now, no extra copy:
            # it no longer fills the budget, and the rounds give r1 a copy again
            hosts.restore("a")
            back = worker("a", 0, "r1")
            c.wait_http([back])
            c.wait_workers(router, {"w-a", "w-c"})
            deadline = time.monotonic() + 60
            while not ((copies := stats()["copies"])["outcomes"].get("ordered") == 2
                       and copies["held"] == 1):
                assert time.monotonic() < deadline, json.dumps(copies)
                time.sleep(1.0)
            print("copies after r1 returned:", copies)
        finally:
            c.close()
