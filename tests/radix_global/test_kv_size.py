"""KV bytes per token (radix_global/kv_size.py): from a model's config.json, from SGLang's
/server_info, and the one rule both the launch wrapper and the router use."""

from __future__ import annotations

import json

import pytest

from radix_global import kv_size
from radix_global.registration import (
    RegistrationError,
    WorkerInfo,
    decode_worker_info,
    encode_worker_info,
)
from sglang_patch.register import kv_bytes_per_token

LLAMA3_70B = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "hidden_size": 8192, "torch_dtype": "bfloat16"}
TINY = {"num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 2,
        "hidden_size": 384, "torch_dtype": "float32"}  # sglang_patch/make_model.py's recipe


def test_from_model_config():
    assert kv_size.from_model_config(LLAMA3_70B, 2) == 320 * 1024  # the cost model's default
    # 16 TP ranks hold 16 copies-or-shards of 8 KV heads: each rank fetches its own.
    assert kv_size.from_model_config(LLAMA3_70B, 2, tp_size=16) == 640 * 1024
    assert kv_size.from_model_config(TINY, 4) == 6 * 2 * 64 * 2 * 4
    assert kv_size.from_model_config({**TINY, "head_dim": 32}, 4) == 6 * 2 * 32 * 2 * 4
    mla = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert kv_size.from_model_config(mla, 2, tp_size=8) == 61 * 576 * 2 * 8
    assert kv_size.from_model_config({"text_config": TINY}, 4) == 6144  # multimodal
    assert kv_size.from_model_config({"num_hidden_layers": 4}, 2) is None  # says too little


def test_from_server_info_sglang_0_5_23_shape():
    # /server_info: server args + scheduler info + internal_states (one per DP rank), whose
    # memory_usage is rank 0's KV pool in GiB (3 decimals) and its token capacity.
    server = {"tp_size": 2, "pp_size": 1, "max_total_num_tokens": 100_000,
              "internal_states": [{"memory_usage": {"weight": 0.1, "kvcache": 0.286,
                                                    "token_capacity": 100_000, "graph": {}}}]}
    per_rank = round(0.286 * 2**30 / 100_000)
    assert kv_size.from_server_info(server) == 2 * per_rank
    assert kv_size.from_server_info({"internal_states": []}) is None
    assert kv_size.from_server_info({}) is None  # vLLM's /v1/models has nothing of the kind
    zero = {"internal_states": [{"memory_usage": {"kvcache": 0.0, "token_capacity": 10}}]}
    assert kv_size.from_server_info(zero) is None


@pytest.mark.parametrize("server, element", [
    ({"dtype": "float32", "kv_cache_dtype": "auto"}, 4),
    ({"dtype": "auto", "kv_cache_dtype": "auto"}, 2),  # SGLang casts a float32 checkpoint to fp16
    ({"dtype": "bfloat16", "kv_cache_dtype": "fp8_e4m3"}, 1),
])
def test_the_worker_side_reads_its_own_model_folder(tmp_path, server, element):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert kv_bytes_per_token(str(tmp_path), server) == 6 * 2 * 64 * 2 * element
    # No folder (or no config.json): what /server_info says of the pool, else nothing.
    assert kv_bytes_per_token(str(tmp_path / "nope"), server) is None


def test_registration_field():
    info = WorkerInfo(worker_id="w", url="http://h:1", model="m", namespace="m@1", page_size=16,
                      kv_bytes_per_token=6144)
    assert decode_worker_info(encode_worker_info(info)).kv_bytes_per_token == 6144
    legacy = b'{"worker_id":"w","url":"http://h:1","model":"m","namespace":"m@1","page_size":16}'
    assert decode_worker_info(legacy).kv_bytes_per_token is None  # optional: old workers work
    with pytest.raises(RegistrationError, match="kv_bytes_per_token"):
        WorkerInfo(worker_id="w", url="http://h:1", model="m", namespace="m@1", page_size=16,
                   kv_bytes_per_token=0)
