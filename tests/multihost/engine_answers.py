"""What the multihost tests compare an engine's answer with: a cold run's greedy tokens (HF
transformers), and the tokens the engine says it loaded from the pool."""

from __future__ import annotations


def greedy(model_dir: str, ids: list[int]) -> list[int]:
    """The first 4 greedy tokens after ``ids``, computed from scratch."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return hf.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False,
                           pad_token_id=0)[0, len(ids):].tolist()


def storage(answer: dict) -> int:
    """Prompt tokens SGLang's native answer says came from the pool (its storage tier)."""
    return int((answer["meta_info"].get("cached_tokens_details") or {}).get("storage") or 0)
