"""Mooncake Store as the cluster's L3 pool: a prefix computed on one host is fetched on another.

Hosts ``a`` and ``b`` run one real SGLang CPU worker each (``radix-global sglang
--radix-global-pool mooncake://M:50051``: each contributes a segment and writes its pages
there), ``m`` the Mooncake master, ``r`` the router. A conversation X's first turn is computed
where the router sends it;
that worker is then drained, so the second turn must go to the other host. There the engine
loads the history from Mooncake Store: it reports storage tokens, its greedy output equals a
cold run (HF transformers), the router predicted the fetch (``x-radix-prefix-tokens``, from the
pool pages the first worker published), and the receiving host's link carried at least the
history's KV bytes (the pages lived in the first host's segment).

A store's run over its segments (issue 44, docs/interfaces.md "Mooncake Store as the L3 pool"):
the pages the second turn added are in the other host's segment, the first turn's in the first
host's. With both engines' own caches flushed, the third turn is planned as one fetch of the
whole run across both segments and the engine loads exactly that (negative control, run once by
hand: with ``--policy-option store_runs=false`` the router plans the first segment's run only,
400 tokens against the 464 loaded).

What the cache was worth, with known values (issue 41, docs/interfaces.md "What the cache is
worth, live"): a second conversation Z's first turn is computed on the first host (sent to its
engine directly). With that host's cable throttled to 0.5 Mbit/s, Z's second turn is routed to
the other host with a fetch planned, the fetch outlasts the engine's 10 s prefetch timeout, and
the engine recomputes (no storage tokens, output equal to a cold run); then one request is
refused for an SLO no engine can meet. The router's counters (prompt, available, captured,
planned, delivered by tier, late, storage bytes, decisions) equal the values the requests were
built to give: late is exactly Z's history (negative control: with the late term not booked
the test fails). The throttled read outlives Mooncake's 10 s read lease and fails, and the
reader's backend then skips the first host's replicas for 60 s: that is why the store run is
checked before it.

Then the first host fails (cable, then processes): its worker and its segment leave the
router's index together within the heartbeat timeout, and the other host still answers.

The negative control, per-host shm pools (the second host then loads nothing, because nothing
crosses the hosts but the network), runs on ``test_across_hosts_e2e.py``'s cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from engine_answers import greedy, storage
from waits import until

from radix_global import kv_size
from radix_global.keys import page_digests
from radix_global.trace import synthetic_word
from radix_global_tools.cluster.host_cluster import HostCluster
from radix_global_tools.cluster.hosts import HostSet

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]
PAGE = 16
KEYS = Path(__file__).with_name("mooncake_keys.py")
FILL_ROUNDS = 6  # bounded: each writes 2.5x the store
REPO = Path(__file__).resolve().parents[2]
# Both workers give up a prefetch after 10 s (SGLang's "timeout" policy): a fetch over an
# unthrottled cable takes well under a second, a throttled history (2.5 MB at 0.5 Mbit/s) ~40 s.
PREFETCH = ("--hicache-storage-prefetch-policy", "timeout",
            "--hicache-storage-backend-extra-config", json.dumps({"prefetch_timeout_base": 10}))
THROTTLE_MBIT = 0.5


class Known(NamedTuple):
    """What the economics must say after the known requests (docs/interfaces.md, "What the
    cache is worth, live"): of the ``accepted`` requests', ``prompt`` tokens, ``loaded`` were
    planned from the pool and loaded, ``late`` planned and recomputed; one refusal."""

    prompt: int
    loaded: int
    late: int
    accepted: int
    kv_bytes: int


def whole_pages(tokens: int) -> int:
    """The prefix of a turn of ``tokens`` the conversation's next turn finds: whole pages."""
    return tokens // PAGE * PAGE


def check_known_economics(metrics: str, k: Known) -> None:
    """The router's counters for the model, over all workers, equal the known values."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = [s for f in text_string_to_metric_families(metrics) for s in f.samples]

    def total(name: str, **labels: str) -> float:  # the planned fetch has no model label
        return sum(s.value for s in samples
                   if s.name == name and s.labels.get("model", "tiny") == "tiny"
                   and all(s.labels.get(key) == v for key, v in labels.items()))

    planned = k.loaded + k.late  # nothing else was cached: every prefix came from the pool
    got = {"prompt": total("radix_global_prompt_tokens_total"),
           "available": total("radix_global_available_prefix_tokens_total"),
           "captured": total("radix_global_captured_prefix_tokens_total"),
           "planned": total("radix_global_fetch_planned_tokens_total"),
           "storage": total("radix_global_delivered_prefix_tokens_total", tier="storage"),
           "delivered": total("radix_global_delivered_prefix_tokens_total"),
           "late": total("radix_global_late_prefix_tokens_total"),
           "bytes": total("radix_global_storage_loaded_bytes_total"),
           "accepted": total("radix_global_decisions_total", outcome="accepted"),
           "refused": total("radix_global_decisions_total", outcome="ttft_slo")}
    want = {"prompt": k.prompt, "available": planned, "captured": planned, "planned": planned,
            "storage": k.loaded, "delivered": k.loaded, "late": k.late,
            "bytes": k.loaded * k.kv_bytes, "accepted": k.accepted, "refused": 1}
    print("economics:", got)
    assert got == want, (got, want)



def index_stats(c: HostCluster, router_url: str) -> dict:
    return dict(c.request("GET", router_url + "/admin/stats", admin=True).json()["index"])


def stored(c: HostCluster, router_url: str) -> int:
    return int(index_stats(c, router_url)["pages_stored"])



def test_a_prefix_computed_on_one_host_is_fetched_on_another(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    from router.keying.tokenize import TokenizerCache

    tok = TokenizerCache().get(str(tiny_model_dir))

    def conversation(seed: int) -> list[list[int]]:
        chat = [{"role": "system", "content": " ".join(
            synthetic_word(i * seed) for i in range(400))}, {"role": "user", "content": "first"}]
        turns = [tok.encode_chat(chat)]
        for question in (" ".join(synthetic_word(i * seed + 1) for i in range(60)), "third"):
            chat += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": question}]
            turns.append(tok.encode_chat(chat))
        return turns

    turn1, turn2, turn3 = conversation(13)
    z1, z2, _ = conversation(17)
    reference, z_reference, reference3 = (greedy(str(tiny_model_dir), ids)
                                          for ids in (turn2, z2, turn3))
    kv_bytes = kv_size.for_worker(str(tiny_model_dir), {"dtype": "float32"})  # as run
    assert kv_bytes

    with HostSet(["a", "b", "r", "m"], tmp_path) as hosts:
        c = HostCluster(hosts, tiny_model_dir, client_host="r", page_size=PAGE)
        try:
            master = c.start_mooncake_master("m")
            router = c.start_router("r", options=[
                "--profile-max-tokens", "0", "--heartbeat-timeout-s", "4",
                "--health-check-interval-s", "0.5"])
            workers = [c.start_worker(h, router, cores={n}, mooncake=master, extra=PREFETCH)
                       for n, h in enumerate("ab")]
            c.wait_http(workers)
            c.wait_workers(router, {"w-a", "w-b"})

            def generate(ids: list[int], url: str = router.url) -> tuple[str, int, int, dict]:
                r = c.request("POST", url + "/generate", timeout=240.0, json={
                    "input_ids": ids, "sampling_params": {"max_new_tokens": 4,
                                                          "temperature": 0}})
                assert r.status_code == 200, r.text
                h = r.headers
                return h.get("x-radix-worker", ""), int(h.get("x-radix-prefix-tokens", 0)), \
                    int(h.get("x-radix-fetch-tokens", 0)), r.json()

            home, _, _, _ = generate(turn1)
            other = "w-b" if home == "w-a" else "w-a"
            # Z's first turn is computed on the same host, sent to its engine directly
            generate(z1, workers["ab".index(home[2:])].url)
            # both first turns' pages reach the store (write-through) and R's index, on the
            # GPU tier and the pool's
            want = 2 * (len(turn1) // PAGE - 1) + 2 * (len(z1) // PAGE - 1)
            until(lambda: stored(c, router.url) >= want, lambda: (stored(c, router.url), want))
            pool_pages = int(index_stats(c, router.url)["tier_pages"]["pool"])
            assert c.request("POST", f"{router.url}/admin/workers/{home}/drain",
                             admin=True).status_code == 200

            before = hosts.bytes(other[2:])
            worker, predicted, _, answer = generate(turn2)
            received = hosts.bytes(other[2:]).rx - before.rx
            assert worker == other
            assert answer["output_ids"] == reference  # equal to a cold run
            history_kv = (len(turn1) // PAGE - 1) * PAGE * kv_bytes
            print(f"predicted {predicted}, storage {storage(answer)} of {len(turn2)}, "
                  f"{other} received {received} B (history KV {history_kv} B)")
            assert storage(answer) >= len(turn1) - 2 * PAGE, answer["meta_info"]
            assert predicted >= len(turn1) - 2 * PAGE  # the router knew it was fetchable
            assert received >= history_kv, (received, history_kv)
            stats = c.request("GET", router.url + "/admin/stats", admin=True).json()
            assert stats["recent"][-1]["engine_storage_tokens"] == storage(answer)

            # A store's run over its segments (issue 44, docs/interfaces.md "Mooncake Store as
            # the L3 pool"): X's first turn is in home's segment, the pages its second turn
            # added in other's (waited for). With both engines' own caches flushed (the index
            # sees no GPU or host copy left), X's third turn is planned and loaded whole, across
            # both segments.
            def tiers() -> dict[str, int]:
                return dict(index_stats(c, router.url)["tier_pages"])

            added = (whole_pages(len(turn2)) - whole_pages(len(turn1))) // PAGE
            until(lambda: tiers()["pool"] >= pool_pages + added, tiers)
            for proc in workers:  # an engine refuses while it still moves pages
                until(lambda p=proc: c.request("POST", p.url + "/flush_cache").status_code == 200,
                      f"{proc.host} never flushed", timeout_s=60, every_s=1.0)
            until(lambda: not any(tiers().get(t) for t in ("gpu", "host")), tiers)
            # the router counts what it routed as held until 5 s after the request finished
            # (conductor's routed_settle_s: KV events come after the batch); the flush came
            # sooner
            time.sleep(5.5)
            worker, _, fetch, answer = generate(turn3)
            pieces = c.request("GET", router.url + "/admin/stats",
                               admin=True).json()["recent"][-1].get("fetch_pieces")
            print(f"store run: fetch {fetch}, storage {storage(answer)} of {len(turn3)}, "
                  f"pieces {pieces}")
            assert worker == other and answer["output_ids"] == reference3
            assert fetch == storage(answer) == whole_pages(len(turn2)), answer["meta_info"]
            assert pieces is not None and len({h for h, _, _ in pieces}) == 2, pieces

            # Z's second turn: the home host's cable throttled, its fetch outlasts the engine's
            # prefetch timeout, the engine recomputes (late: planned, not loaded)
            hosts.shape(home[2:], THROTTLE_MBIT)
            try:
                worker, _, z_fetch, z_answer = generate(z2)
            finally:
                hosts.shape(home[2:], None)
            # the throttled cable carried the home worker's heartbeats too: it must not have left
            assert {w["worker_id"] for w in c.workers(router)} == {home, other}
            print(f"throttled: fetch {z_fetch}, meta {z_answer['meta_info']}")
            assert worker == other and z_answer["output_ids"] == z_reference
            assert z_fetch > 0 and storage(z_answer) == 0, z_answer["meta_info"]
            refused = c.request("POST", router.url + "/generate", timeout=60.0, json={
                "input_ids": turn2, "ttft_slo_s": 1e-6,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
            assert refused.status_code == 429, refused.text
            check_known_economics(c.request("GET", router.url + "/metrics").text, Known(
                prompt=len(turn1) + len(turn2) + len(turn3) + len(z2),
                loaded=whole_pages(len(turn1)) + whole_pages(len(turn2)),
                late=whole_pages(len(z1)), accepted=4, kv_bytes=kv_bytes))

            # the home host dies: its worker and its segment (the history's pool pages) leave
            # R's index together once the heartbeat timeout passed (the worker holds nothing
            # since the flush: the segment is the holder that goes)
            holders = index_stats(c, router.url)["holders"]
            hosts.fail(home[2:])
            c.forget(home[2:])
            deadline = time.monotonic() + 20
            while {w["worker_id"] for w in c.workers(router)} != {other}:
                assert time.monotonic() < deadline, c.workers(router)
                time.sleep(0.3)
            assert index_stats(c, router.url)["holders"] == holders - 1
            # B still answers the conversation, from what it loaded, equal to the cold run
            worker, _, _, again = generate(turn2)
            assert worker == other and again["output_ids"] == reference
        finally:
            c.close()


def test_corrupt_pages_are_recomputed_and_store_evictions_leave_the_index(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two workers on one Mooncake Store with small segments: ``a`` verifies checksums and
    resyncs every 2 s, ``b`` does neither (the test-only switch, and ``pool_resync_s`` 0).

    - A prefix ``a`` computed is corrupted in the store (a raw client rewrites its objects):
      ``b`` loads the bad bytes and answers differently from a cold run (the negative control);
      ``a``, its own caches flushed, catches them by checksum, recomputes, and answers as cold.
    - The store is filled past its high watermark, so Mooncake evicts silently: the pages ``a``
      wrote and lost leave the router's index within the resync bound; those ``b`` lost stay
      (stale entries: resync off, the negative control). Mooncake picks what it evicts, and
      sometimes keeps all of ``b``'s pages: that control then does not run (printed)."""
    from router.keying.tokenize import TokenizerCache

    tok = TokenizerCache().get(str(tiny_model_dir))

    def prompt(seed: int) -> list[int]:
        return tok.encode_chat([{"role": "system", "content": " ".join(
            synthetic_word(seed + i * 13) for i in range(300))}, {"role": "user", "content": "q"}])

    shared, tail = prompt(1), tok.encode_chat([{"role": "user", "content": "more"}])
    reference = greedy(str(tiny_model_dir), shared + tail)
    with HostSet(["a", "b", "r", "m"], tmp_path) as hosts:
        c = HostCluster(hosts, tiny_model_dir, client_host="r", page_size=PAGE)
        helper: subprocess.Popen[str] | None = None
        try:
            # a 1 s read lease (Mooncake's default: 10 s), so that the test's own probes and a's
            # resync rounds pin pages only briefly
            master = c.start_mooncake_master("m", options=["--default_kv_lease_ttl=1000"])
            router = c.start_router("r", options=["--profile-max-tokens", "0"])

            def resync(seconds: float) -> list[str]:
                return ["--hicache-storage-backend-extra-config",
                        json.dumps({"pool_resync_s": seconds})]

            small = 0.016  # GB: Mooncake's smallest segment (16 MiB), ~170 pages
            workers = [c.start_worker("a", router, {0}, resync(2.0), master,
                                      pool_capacity_gb=small),
                       c.start_worker("b", router, {1}, resync(0.0), master,
                                      env={"RADIX_GLOBAL_POOL_NO_VERIFY": "1"},
                                      pool_capacity_gb=small)]
            c.wait_http(workers)
            c.wait_workers(router, {"w-a", "w-b"})
            url = {w.host: w.url for w in workers}
            ns = {w["worker_id"]: w["namespace"] for w in c.workers(router)}["w-a"]

            def keys(ids: list[int]) -> list[str]:
                return [f"{ns}/{d.hex()}" for d in page_digests(ids, PAGE)]

            helper = subprocess.Popen(
                hosts.argv("m", [sys.executable, str(KEYS), master, hosts["m"].address]),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONPATH": str(REPO)})

            def raw(op: dict) -> dict:
                assert helper.stdin is not None and helper.stdout is not None
                helper.stdin.write(json.dumps(op) + "\n")
                helper.stdin.flush()
                line = helper.stdout.readline()
                assert line, "the raw Mooncake client died"
                return dict(json.loads(line))

            def generate(host: str, ids: list[int]) -> dict:
                r = c.request("POST", url[host] + "/generate", timeout=240.0, json={
                    "input_ids": ids, "sampling_params": {"max_new_tokens": 4,
                                                          "temperature": 0}})
                assert r.status_code == 200, r.text
                return dict(r.json())

            def computed(host: str, ids: list[int]) -> None:
                """``host`` computes ``ids``; its pages reach the store (write-through)."""
                generate(host, ids)
                deadline = time.monotonic() + 30
                while not all(raw({"exist": keys(ids)})["exist"]):
                    assert time.monotonic() < deadline, f"{host}'s pages never reached the store"
                    time.sleep(0.5)

            computed("a", shared)
            assert raw({"corrupt": keys(shared)})["corrupted"] == len(keys(shared))
            blind = generate("b", shared + tail)
            assert storage(blind) >= PAGE, blind["meta_info"]  # it loaded the bad pages
            assert blind["output_ids"] != reference  # negative control: wrong bytes, wrong text
            assert c.request("POST", url["a"] + "/flush_cache").status_code == 200
            checked = generate("a", shared + tail)
            assert storage(checked) == 0, checked["meta_info"]  # caught: nothing loaded
            assert checked["output_ids"] == reference  # recomputed, as a cold run

            mine = {"a": prompt(2), "b": prompt(3)}
            for host, ids in mine.items():
                computed(host, ids)
            time.sleep(2.0)  # past the leases of the existence checks
            removed = int(index_stats(c, router.url)["pages_removed"])
            # what each worker wrote (a put of an existing key writes nothing): a rewrote the
            # shared prefix after its checksum failures, b the pages past it
            wrote = {"a": keys(shared) + keys(mine["a"]),
                     "b": keys(shared + tail)[len(keys(shared)):] + keys(mine["b"])}
            # Mooncake picks what it evicts: fill until both lost pages (a CI run's 3 fills
            # evicted 28 of a's pages and none of b's)
            for _ in range(FILL_ROUNDS):
                assert raw({"fill": 160})["stored"] > 0  # 2.5x the store: 16+16+32 MiB
                gone = {h: len(k) - sum(raw({"exist": k})["exist"]) for h, k in wrote.items()}
                if gone["a"] >= 1 and gone["b"] >= 1:
                    break
            print(f"evicted pages: {gone} of {({h: len(k) for h, k in wrote.items()})}")
            assert gone["a"] >= 1, gone  # the fill did evict a's
            # a's resync (2 s rounds, each page probed within 2 x 4 rounds) drops what a lost
            deadline = time.monotonic() + 30
            while int(index_stats(c, router.url)["pages_removed"]) - removed < gone["a"]:
                assert time.monotonic() < deadline, index_stats(c, router.url)
                time.sleep(0.5)
            if gone["b"] == 0:  # seen twice on 2026-12-05, even after 10 fills
                print("the negative control did not run: Mooncake evicted none of b's pages")
                return
            time.sleep(6.0)  # three more of a's rounds: b's losses never leave the index
            dropped = int(index_stats(c, router.url)["pages_removed"]) - removed
            assert dropped < gone["a"] + gone["b"], (dropped, gone)
        finally:
            if helper is not None:
                helper.kill()
                helper.wait(timeout=30)
            c.close()
