"""Persistence and sharing together (issue 44; docs/interfaces.md, "The persistent disk tier
under the pool"): a worker on the Mooncake Store with our disk tier under its segment survives a
full restart of the cluster (master, router and worker) on test hosts.

Host ``a`` runs a real SGLang CPU worker (``--radix-global-pool mooncake://M:50051
--radix-global-pool-disk DIR``), ``m`` the Mooncake master, ``r`` the router. Two conversations
get their first turn. Everything stops (the store's memory is gone) and starts again on the same
disk folder; conversation 2's page files are deleted in between (the negative control). Then:

- the restarted backend announces the disk to the new router before any request;
- conversation 1's second turn: the router plans the fetch from the disk holder, the engine
  loads the history from storage, its output equals a cold run (HF transformers);
- conversation 2's second turn recomputes (no storage tokens): the tokens above came from the
  disk, not from anything else that outlived the restart.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from engine_answers import greedy, storage

from radix_global.keys import page_digests
from radix_global.trace import synthetic_word
from radix_global_tools.cluster.host_cluster import HostCluster, HostProc
from radix_global_tools.cluster.hosts import HostSet
from sglang_patch.pool.disk_format import file_stem

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]
PAGE = 16




def test_the_disk_under_a_mooncake_segment_survives_a_full_restart(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    from router.keying.tokenize import TokenizerCache

    tok = TokenizerCache().get(str(tiny_model_dir))
    convos = []
    for seed in (3, 5):
        history = [{"role": "system", "content": " ".join(
            synthetic_word(seed + i * 11) for i in range(300))}, {"role": "user", "content": "q"}]
        convos.append((tok.encode_chat(history), tok.encode_chat(
            [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "n"}])))
    references = [greedy(str(tiny_model_dir), turn2) for _, turn2 in convos]
    disk = tmp_path / "disk"

    with HostSet(["a", "m", "r"], tmp_path / "hosts") as hosts:
        c = HostCluster(hosts, tiny_model_dir, client_host="r", page_size=PAGE)

        def up() -> tuple[HostProc, HostProc]:
            master = c.start_mooncake_master("m")
            router = c.start_router("r", options=["--profile-max-tokens", "0"])
            worker = c.start_worker("a", router, {0}, mooncake=master, extra=[
                "--radix-global-pool-disk", str(disk)])
            c.wait_http([worker])
            c.wait_workers(router, {"w-a"})
            return router, worker

        def generate(router: HostProc, ids: list[int]) -> tuple[int, dict]:
            r = c.request("POST", router.url + "/generate", timeout=240.0, json={
                "input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
            assert r.status_code == 200, r.text
            return int(r.headers["x-radix-fetch-tokens"]), r.json()

        def announced(router: HostProc) -> int:
            """Pages the new router's index was told of (before any request: the disk's)."""
            body = c.request("GET", router.url + "/admin/stats", admin=True).json()
            return int(body["index"]["pages_stored"])

        try:
            router, _ = up()
            for turn1, _ in convos:
                generate(router, turn1)
            (info,) = c.workers(router)
            ns, written = info["namespace"], []
            for turn1, _ in convos:
                written.append([disk / (n := file_stem(f"{ns}/{d.hex()}"))[:2] / f"{n}.page"
                                for d in page_digests(turn1, PAGE)[: len(turn1) // PAGE - 1]])
            deadline = time.monotonic() + 30
            while not all(f.exists() for files in written for f in files):
                assert time.monotonic() < deadline, "the disk tier did not get the pages"
                time.sleep(0.5)

            c.close()  # the full restart: master, router and worker; the store's memory is gone
            c = HostCluster(hosts, tiny_model_dir, client_host="r", page_size=PAGE)
            for f in written[1]:  # the negative control: conversation 2 is not on disk
                f.unlink()
            router, _ = up()
            history = len(convos[0][0]) // PAGE - 1
            deadline = time.monotonic() + 30
            while (known := announced(router)) < history:
                assert time.monotonic() < deadline, f"announced {known} pages < {history}"
                time.sleep(0.5)

            fetch, answer = generate(router, convos[0][1])
            print(f"after the restart: fetch planned {fetch}, storage {storage(answer)} of "
                  f"{len(convos[0][1])}")
            assert fetch >= (history - 1) * PAGE  # from the disk holder
            assert storage(answer) >= (history - 1) * PAGE, answer["meta_info"]
            assert answer["output_ids"] == references[0]
            fetch, answer = generate(router, convos[1][1])
            print(f"control: fetch planned {fetch}, storage {storage(answer)}")
            assert storage(answer) == 0 and fetch == 0
            assert answer["output_ids"] == references[1]
        finally:
            c.close()
