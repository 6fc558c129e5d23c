"""SGLang's native PD across hosts: prefill on host ``a``, decode on host ``b`` (Mooncake TCP,
through our launch wrapper, which patches SGLang for CPU), our HTTP router on host ``r``.

The router learns both roles and the prefill worker's bootstrap port from the registrations
that came over the network, and sends each request to both halves with SGLang's bootstrap
fields (``router/request/relay.py``). Checked: the decode worker's greedy output equals a
colocated run (HF transformers on the same weights, equal to SGLang's on CPU:
``tests/sglang_patch/test_sglang_server.py``), and the prompt's KV crossed the A-B link (host
A sent and host B received at least the prompt's KV bytes, the router's host far less: the KV
did not travel through the router). Mooncake's listeners bind every interface: here they are
inside the hosts' namespaces only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from radix_global import kv_size, trace
from radix_global_tools.cluster.host_cluster import HostCluster
from radix_global_tools.cluster.hosts import HostSet

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]
PAGE = 4
PD = ["--disaggregation-transfer-backend", "mooncake_tcp"]


def test_native_pd_across_hosts_equals_colocated_and_kv_crossed_the_link(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    ids = trace.synthesize_prompt([5151, 5152, 5153, 5154], 4 * 512, 64)  # 256 tokens
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        reference = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                pad_token_id=0)[0, len(ids):].tolist()
    del hf
    kv_bytes = kv_size.for_worker(str(tiny_model_dir), {"dtype": "float32"})  # as run
    assert kv_bytes, "the tiny model's KV size per token"

    with HostSet(["a", "b", "r"], tmp_path) as hosts:
        c = HostCluster(hosts, tiny_model_dir, client_host="r", page_size=PAGE)
        try:
            router = c.start_router("r", options=["--profile-max-tokens", "0"])
            prefill = c.start_worker("a", router, cores={0}, extra=[
                *PD, "--disaggregation-mode", "prefill"])
            decode = c.start_worker("b", router, cores={1}, extra=[
                *PD, "--disaggregation-mode", "decode"])
            c.wait_http([prefill, decode])
            c.wait_workers(router, {"w-a", "w-b"})
            roles = {w["worker_id"]: w["role"] for w in c.workers(router)}
            assert roles == {"w-a": "prefill", "w-b": "decode"}, roles

            before = {h: hosts.bytes(h) for h in ("a", "b", "r")}
            r = c.request("POST", router.url + "/generate", timeout=240.0, json={
                "input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
            after = {h: hosts.bytes(h) for h in ("a", "b", "r")}
            assert r.status_code == 200, r.text
            assert r.json()["output_ids"] == reference, (r.json(), reference)
            assert r.headers["x-radix-worker"] == "w-a"

            prompt_kv = len(ids) * kv_bytes
            sent_a = after["a"].tx - before["a"].tx
            got_b = after["b"].rx - before["b"].rx
            via_r = (after["r"].rx - before["r"].rx) + (after["r"].tx - before["r"].tx)
            print(f"prompt KV {prompt_kv} B; A sent {sent_a} B, B received {got_b} B, "
                  f"R's link carried {via_r} B")
            assert sent_a >= prompt_kv and got_b >= prompt_kv, (sent_a, got_b, prompt_kv)
            assert via_r < prompt_kv / 2, (via_r, prompt_kv)
        finally:
            c.close()
