"""Pool PD hand-off through the router's HTTP front end, with real SGLang CPU workers.

The real router (``build_app`` under uvicorn on a loopback port, ``pd_mode="pool"``) and three
workers started by ``radix-global sglang`` on one shared pool, registering themselves with the
router: P (``--role prefill``), D1 and D2 (``--role decode``, no ``--disaggregation-mode``: the
wrapper gives them ``wait_complete`` prefetch and a one-page prefetch threshold). Requests go to
the router only. Checks:

1. A streamed ``/generate``: the greedy output equals a non-disaggregated run of the same prompt
   (on P under another ``cache_salt``: no shared page, computed from scratch in one server); the
   decode worker reports the prompt cached *from storage* (``cached_tokens_details.storage``).
2. Turn 2 of the conversation (non-streamed): the prefill worker computed only the new suffix.
3. D1 is killed: the next requests (two at once) finish on D2, same outputs, nothing hangs.
4. Saturated decode pool (D2's KV held by an open long stream): the next request gets 429 with
   ``Retry-After`` and P receives nothing (its log shows no new prefill batch); the client closing
   the long stream releases the reservation, and the same request is then served.

Negative control (run by hand: this file with ``"--radix-global-pool-id", "negctl-other-pool"``
appended to the decode workers' arguments, so they do not share P's pool): check 1 fails at the
``storage`` assertion, ``assert 0 >= (576 - (2 * 4))`` (the decode worker recomputed the whole
prompt; the output still matched, since recomputing is never wrong).
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_peer import ServerThread, registered_workers
from pd_workers import ENGINE_FLAGS, PAGE, Worker, kill, prompt, spawn, stop, wait_healthy

from router.config import RouterConfig
from router.http.app import build_app
from router.state import RouterState
from sglang_patch.pool.shm_pool import destroy_pool

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1500)]

NS = "tiny@pdhttp"
DECODE_TOKENS = 4096  # --max-total-tokens of the decode workers: their KV capacity


def body(ids: list[int], n: int, **extra: Any) -> dict[str, Any]:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0},
            **extra}


def events(raw: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in raw.splitlines()
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]")]


def storage(meta: dict[str, Any]) -> int:
    return int((meta.get("cached_tokens_details") or {}).get("storage") or 0)


def prefill_batches(w: Worker) -> int:
    return w.log.read_text(errors="replace").count("Prefill batch")


def recent(client: httpx.Client, rid: str) -> dict[str, Any]:
    """The router's record of the request the client labelled ``rid`` (engine rids are the
    router's own)."""
    items = client.get("/admin/stats").json()["recent"]
    return next(r for r in reversed(items) if r.get("client_request_id") == rid)


def test_pool_handoff_through_the_router(tiny_model_dir: Path) -> None:
    pool_id = f"pdh-{uuid.uuid4().hex[:8]}"
    # Health checks off: SGLang answers /health with a generation, which would show up on P.
    config = RouterConfig.from_options(pd_mode="pool", profile_max_tokens=0,
                                       health_check_interval_s=3600,
                                       pd_pool_ready_timeout_s=20.0, pd_ratio="1:2")
    router = ServerThread(build_app(RouterState(config))).start()
    common = ["--radix-global", router.url, "--radix-global-pool-id", pool_id,
              "--radix-global-pool-capacity-gb", "0.1", "--radix-global-namespace", NS]
    decode_flags = [*ENGINE_FLAGS, "--max-total-tokens", str(DECODE_TOKENS)]
    workers = {"P": spawn("P", tiny_model_dir, [*common, "--radix-global-worker-id", "P",
                                                "--radix-global-role", "prefill"], ENGINE_FLAGS)}
    for name in ("D1", "D2"):
        workers[name] = spawn(name, tiny_model_dir,
                              [*common, "--radix-global-worker-id", name,
                               "--radix-global-role", "decode"], decode_flags)
    try:
        wait_healthy(list(workers.values()), 900)
        with httpx.Client(base_url=router.url, timeout=httpx.Timeout(300, connect=5)) as client:
            _scenario(client, workers)
    finally:
        for w in workers.values():
            stop(w)
        router.stop()
        destroy_pool(pool_id)


def _registered(client: httpx.Client) -> dict[str, str]:
    return {w["worker_id"]: w["role"] for w in registered_workers(client, 3)}


def _scenario(client: httpx.Client, w: dict[str, Worker]) -> None:
    assert _registered(client) == {"P": "prefill", "D1": "decode", "D2": "decode"}
    direct = httpx.Client(timeout=300)

    def reference(ids: list[int], n: int) -> dict[str, Any]:
        salt = f"reference-{uuid.uuid4().hex}"  # shares no page with anything computed before
        r = direct.post(w["P"].url + "/generate", json=body(ids, n, cache_salt=salt))
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["cached_tokens"] == 0
        return dict(r.json())

    # 1: streamed, through the router; output = non-disaggregated; prompt from the pool.
    turn1 = prompt(list(range(700, 712)))  # 576 tokens
    ref1 = reference(turn1, 16)
    r = client.post("/generate", json=body(turn1, 16, stream=True, rid="t1"))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-radix-worker"] == "P" and r.headers["x-radix-decode-worker"] in w
    last = events(r.text)[-1]
    assert last["output_ids"] == ref1["output_ids"] and last["text"] == ref1["text"]
    meta = last["meta_info"]
    assert storage(meta) >= len(turn1) - 2 * PAGE, meta  # fetched, not recomputed
    assert meta["cached_tokens"] >= len(turn1) - 2 * PAGE, meta
    s1 = recent(client, "t1")
    assert s1["pd"] == "pool" and s1["ok"] and s1["prefill_cached_tokens"] == 0, s1
    print("turn 1:", len(turn1), "prompt tokens; decode meta", meta, "; router", s1)

    # 2: turn 2, non-streamed: P computes only the new suffix; D gets the rest from the pool.
    turn2 = [*turn1, *ref1["output_ids"], *prompt([9100, 9101])]
    ref2 = reference(turn2, 16)
    r = client.post("/generate", json=body(turn2, 16, rid="t2"))
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == ref2["output_ids"]
    s2 = recent(client, "t2")
    print("turn 2:", len(turn2), "prompt tokens; decode meta", r.json()["meta_info"], "; router",
          s2)
    assert s2["prefill_cached_tokens"] >= len(turn1) - PAGE, s2
    assert r.json()["meta_info"]["cached_tokens"] >= len(turn2) - 2 * PAGE

    # 3: D1 crashes; the next requests finish on D2 with the right output, nothing hangs.
    prompts = {f"k{i}": prompt([800 + i, 850 + i]) for i in range(2)}
    refs = {rid: reference(ids, 8) for rid, ids in prompts.items()}
    kill(w["D1"])

    def send(rid: str) -> httpx.Response:
        return client.post("/generate", json=body(prompts[rid], 8, rid=rid))

    with ThreadPoolExecutor(2) as pool:
        answers = dict(zip(prompts, pool.map(send, prompts, timeout=600), strict=True))
    for rid, resp in answers.items():
        assert resp.status_code == 200, resp.text
        assert resp.json()["output_ids"] == refs[rid]["output_ids"]
        assert resp.headers["x-radix-decode-worker"] == "D2"
    pd = client.get("/admin/stats").json()["pd"]
    print("after the kill:", [recent(client, rid) for rid in prompts], pd)
    assert pd["decode_retries"] >= 1, pd

    # 4: saturated decode pool -> 429 before prefill; the closed stream gives its KV back.
    short = prompt([990, 991])  # 96 tokens
    long_out = DECODE_TOKENS - len(short) - 100  # leaves D2 100 tokens
    long_body = body(short, long_out, stream=True, rid="long")
    long_body["sampling_params"]["ignore_eos"] = True  # decodes (and holds its KV) until closed
    with client.stream("POST", "/generate", json=long_body) as held:
        assert held.status_code == 200
        # Keep the line iterator referenced: a dropped one is closed at once, and closing it
        # closes the stream (the router then rightly aborts "long" as a client disconnect).
        lines = held.iter_lines()
        next(lines)  # routed, reserved, decoding
        before = prefill_batches(w["P"])
        over = client.post("/generate", json=body(short, 200, rid="over"))
        assert over.status_code == 429, over.text
        assert "decode_kv" in over.json()["error"]["message"]
        assert int(over.headers["retry-after"]) >= 1
        time.sleep(1.0)
        assert prefill_batches(w["P"]) == before, "a rejected request reached the prefill worker"
    deadline = time.monotonic() + 60
    while True:
        again = client.post("/generate", json=body(short, 200, rid=f"again-{time.monotonic()}"))
        if again.status_code != 429 or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert again.status_code == 200, again.text
    assert prefill_batches(w["P"]) > before  # the same check sees an accepted request
    pd = client.get("/admin/stats").json()["pd"]
    print("saturation: 429", over.json(), "retry-after", over.headers["retry-after"], "; pd", pd)
    assert pd["configured_ratio"] == "1:2" and pd["decode"]["busy_s"] > 0
    assert pd["prefill"]["busy_s"] > 0 and pd["decode_capacity_tokens"]["D2"] == DECODE_TOKENS
