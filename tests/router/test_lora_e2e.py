"""End to end: a real SGLang CPU worker serving a LoRA adapter (``--enable-lora``, the
torch-native backend with ``sglang_patch.lora_cpu``), its KV events, and the router.

The router learns the adapter from the worker's ``/server_info``, keys a ``tiny:<adapter>``
request exactly as SGLang does, and the embedded index re-keys the adapter's KV events with the
same extra key: the second request of a prompt is predicted from the index (the routed-prefix
memory is off) and the engine confirms the hit; the base model's request of the same prompt is
neither predicted nor served from the adapter's pages.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from chat_e2e import text, wait_router_ready
from http_peer import ServerThread, free_port
from servers import sglang_server

from radix_global.keys import lora_extra_key, page_keys
from radix_global.types import Namespace, WorkerId
from router.config import RouterConfig
from router.http.app import build_app
from router.state import RouterState

pytestmark = [pytest.mark.e2e, pytest.mark.sglang]
PAGE = 16


def make_adapter(out: Path, base: Path, rank: int = 4) -> Path:
    """A small random PEFT LoRA adapter (q_proj, v_proj) for the test model."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((base / "config.json").read_text())
    hidden, heads, kv, head_dim = (cfg["hidden_size"], cfg["num_attention_heads"],
                                   cfg["num_key_value_heads"], cfg["head_dim"])
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for module, out_dim in (("q_proj", heads * head_dim), ("v_proj", kv * head_dim)):
            name = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * 0.05
            tensors[f"{name}.lora_B.weight"] = torch.randn(out_dim, rank, generator=gen) * 0.05
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
        "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "bias": "none",
        "fan_in_fan_out": False, "base_model_name_or_path": str(base)}))
    return out


@pytest.fixture(scope="module")
def lora_worker(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[str, str]]:
    adapter = make_adapter(tmp_path_factory.mktemp("lora") / "ad1", tiny_model_dir)
    events = {"publisher": "zmq", "bind": True, "endpoint": f"tcp://127.0.0.1:{free_port()}",
              "topic": "kv-events"}
    args = ["--served-model-name", "tiny", "--page-size", str(PAGE), "--max-total-tokens",
            "32768", "--enable-cache-report", "--kv-events-config", json.dumps(events),
            "--enable-lora", "--lora-paths", f"ad1={adapter}", "--lora-backend", "torch_native",
            "--max-loras-per-batch", "2", "--max-lora-rank", "4",
            "--lora-target-modules", "q_proj", "v_proj"]
    with sglang_server(tiny_model_dir, args) as server:
        yield server.url, str(adapter)


def _complete(c: httpx.Client, model: str, prompt: str) -> tuple[int, int, str]:
    """(predicted prefix tokens, engine-cached tokens, completion text)."""
    r = c.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4,
                                        "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"] or 0
    return int(r.headers["x-radix-prefix-tokens"]), int(cached), body["choices"][0]["text"]


def test_lora_requests_are_keyed_like_sglang_and_hit_through_the_index(lora_worker,
                                                                        tiny_model_dir):
    url, adapter = lora_worker
    state = RouterState(RouterConfig.from_options(workers=(url,), policy="conductor",
                                                  policy_options={"routed_ttl_s": 0.0},
                                                  health_check_interval_s=1.0))
    server = ServerThread(build_app(state), router=True).start()
    try:
        wait_router_ready(state, workers=1)
        (entry,) = state.registry.all()
        assert entry.lora == {"ad1": lora_extra_key("ad1", adapter)}  # from /server_info
        model = str(tiny_model_dir)
        tok = state.tokenizers.get(model)
        tok.load()
        prompt = text(11, 300)
        with httpx.Client(base_url=server.url, timeout=300) as c:
            predicted, cached, lora_out = _complete(c, "tiny:ad1", prompt)
            assert predicted == 0 and cached == 0
            # the adapter's KV events reach the index under the router's keys for the request
            keys = page_keys(tok.encode_text(prompt), PAGE, extra_key=entry.lora["ad1"])
            ns = Namespace(state.registry.models()["tiny"])
            deadline = time.monotonic() + 30
            while True:
                held = state.index.index.match(ns, keys, time.monotonic()).matched.get(
                    (WorkerId(entry.info.worker_id), 0))
                if held is not None and held.gpu >= len(keys) - 1:
                    break
                assert time.monotonic() < deadline, (held, state.index.stats())
                time.sleep(0.2)
            predicted, cached, again = _complete(c, "tiny:ad1", prompt)
            assert predicted >= (len(keys) - 1) * PAGE  # predicted from the index ...
            assert cached >= predicted - PAGE  # ... and the engine confirms it
            assert again == lora_out
            # the base model's request of the same prompt: SGLang keeps the adapter's pages
            # apart, and so does the router
            predicted, cached, base_out = _complete(c, "tiny", prompt)
            assert predicted == 0 and cached == 0
            assert base_out != lora_out  # the adapter really is applied
    finally:
        server.stop()
