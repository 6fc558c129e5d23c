"""What the multihost tests compare an engine's answer with: a cold run's greedy tokens (HF
transformers), and the tokens the engine says it loaded from the pool."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _model(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def greedy(model_dir: str, ids: list[int]) -> list[int]:
    """The first 4 greedy tokens after ``ids``, computed from scratch (the model loaded once per
    folder)."""
    import torch

    hf = _model(model_dir)
    with torch.no_grad():
        return hf.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False,
                           pad_token_id=0)[0, len(ids):].tolist()


def storage(answer: dict) -> int:
    """Prompt tokens SGLang's native answer says came from the pool (its storage tier)."""
    return int((answer["meta_info"].get("cached_tokens_details") or {}).get("storage") or 0)
