"""A real SGLang 0.5.23 server on CPU serving the make-model tiny Llama (one server per module)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import RunningServer, ServerStartError, sglang_server

from radix_global import trace

pytestmark = [pytest.mark.e2e, pytest.mark.sglang]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    with sglang_server(tiny_model_dir) as srv:
        yield srv


def _generate(srv: RunningServer, ids: list[int] | None = None, text: str | None = None,
              n: int = 8) -> dict[str, Any]:
    body: dict[str, Any] = {"sampling_params": {"max_new_tokens": n, "temperature": 0.0}}
    if ids is not None:
        body["input_ids"] = ids
    else:
        body["text"] = text
    resp = httpx.post(srv.url + "/generate", json=body, timeout=180)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def test_generate_answers(server: RunningServer) -> None:
    out = _generate(server, trace.synthesize_prompt([1001], 512, 16))
    assert len(out["output_ids"]) == 8
    assert out["meta_info"]["prompt_tokens"] == 16
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def test_different_prompts_give_different_greedy_outputs(server: RunningServer) -> None:
    a = _generate(server, trace.synthesize_prompt([2001, 2002], 1024, 32))["output_ids"]
    b = _generate(server, trace.synthesize_prompt([3001, 3002], 1024, 32))["output_ids"]
    assert a != b
    assert len(set(a)) > 2 and len(set(b)) > 2, (a, b)


def test_repeated_prompt_reports_cached_tokens(server: RunningServer) -> None:
    ids = trace.synthesize_prompt([4001, 4002, 4003, 4004], 2048, 32)  # 128 unseen tokens
    first = _generate(server, ids)
    second = _generate(server, ids)
    assert first["meta_info"]["cached_tokens"] == 0
    # The radix cache holds the whole prompt; the last token is always recomputed for logits.
    assert second["meta_info"]["cached_tokens"] >= len(ids) - 1
    assert second["output_ids"] == first["output_ids"]


def test_synthetic_text_tokenizes_to_the_same_ids_in_the_engine(server: RunningServer) -> None:
    ids = trace.synthesize_prompt([5001, 5002], 1024, 24)
    by_ids = _generate(server, ids)
    by_text = _generate(server, text=trace.prompt_text(ids))
    assert by_text["meta_info"]["prompt_tokens"] == len(ids)
    assert by_text["output_ids"] == by_ids["output_ids"]
    # The second request found the first one's prefix: same ids, hence the same pages.
    assert by_text["meta_info"]["cached_tokens"] >= len(ids) - 1


def test_greedy_output_equals_hf_transformers(server: RunningServer, tiny_model_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    ids = trace.synthesize_prompt([6001, 6002], 1024, 32)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                             pad_token_id=0)[0, len(ids):].tolist()
    assert _generate(server, ids)["output_ids"] == ref


def test_bad_server_args_fail_with_log_tail_and_no_leftover(
    sglang_server_factory: Callable[..., RunningServer],
) -> None:
    with pytest.raises(ServerStartError, match="no-such-flag") as info:
        sglang_server_factory(["--no-such-flag"])
    assert info.value.log_path.exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(info.value.pid, 0)  # the whole process group is gone
