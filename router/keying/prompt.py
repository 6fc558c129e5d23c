"""Where the prompt is in each front-end request, and how to turn it into token ids.

Three request shapes: SGLang ``/generate`` (``text`` or ``input_ids``), OpenAI completions
(``prompt``: text, token ids, or a batch of either) and OpenAI chat (``messages``). A batch is
routed by its first prompt (the whole batch goes to one worker).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.keying.tokenize import ModelTokenizer, PromptError, check_token_ids

CHAT, COMPLETION, GENERATE = "chat", "completion", "generate"


def _first(value: Any) -> Any:
    """The first element of a batch, or the value itself."""
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        return value[0]
    return value


def needs_tokenizer(kind: str, payload: dict[str, Any]) -> bool:
    """False when the (first) prompt already is token ids."""
    if kind == GENERATE:
        return payload.get("input_ids") is None
    if kind == COMPLETION:
        prompt = _first(payload.get("prompt"))
        return not isinstance(prompt, list)
    return True


def prompt_token_ids(kind: str, payload: dict[str, Any], tok: ModelTokenizer | None,
                     vocab_size: int | None) -> list[int] | None:
    """Token ids of the (first) prompt; None when text must be tokenized but no tokenizer is
    available (the request is then routed without cache information and counted)."""
    if kind == GENERATE:
        if payload.get("input_ids") is not None:
            return check_token_ids(_first(payload["input_ids"]), vocab_size)
        text = _first(payload.get("text"))
        if not isinstance(text, str):
            raise PromptError("/generate needs 'text' (string) or 'input_ids' (list of ints)")
        return tok.encode_text(text) if tok is not None else None
    if kind == COMPLETION:
        prompt = _first(payload.get("prompt"))
        if isinstance(prompt, str):
            return tok.encode_text(prompt) if tok is not None else None
        if isinstance(prompt, list):
            return check_token_ids(prompt, vocab_size)
        raise PromptError("'prompt' must be a string, a list of token ids, or a batch of either")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptError("'messages' must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise PromptError("each message must be an object with a 'role'")
    if tok is None:
        return None
    kwargs = payload.get("chat_template_kwargs")
    return tok.encode_chat(messages, tools=payload.get("tools"),
                           template_kwargs=kwargs if isinstance(kwargs, dict) else None)


def batch_size(kind: str, payload: Mapping[str, Any]) -> int | None:
    """How many prompts a batch request carries (None: one prompt, not a batch)."""
    if kind == GENERATE:
        text, ids = payload.get("text"), payload.get("input_ids")
        if isinstance(text, list):
            return len(text)
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return len(ids)
    elif kind == COMPLETION:
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            return len(prompt)
    return None


def output_tokens_hint(kind: str, payload: dict[str, Any]) -> int | None:
    if kind == GENERATE:
        params = payload.get("sampling_params")
        value = params.get("max_new_tokens") if isinstance(params, dict) else None
    else:
        value = payload.get("max_completion_tokens") or payload.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_stream(payload: dict[str, Any]) -> bool:
    return payload.get("stream") is True


def engine_storage_tokens(answer: Any) -> int | None:
    """Prompt tokens the engine loaded from its L3 storage (SGLang ``meta_info``
    ``cached_tokens_details.storage``; SGLang sends no details when nothing was cached, which is
    0 here); None when the answer does not say (OpenAI answers carry no such detail)."""
    if isinstance(answer, list) and answer:
        answer = answer[0]
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    if not isinstance(meta, dict):
        return None
    details = meta.get("cached_tokens_details")
    if details is None and meta.get("cached_tokens") == 0:
        return 0
    value = details.get("storage") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def engine_cached_tokens(answer: Any) -> tuple[int | None, int | None]:
    """(cached prompt tokens, prompt tokens) from an engine answer or a final stream chunk:
    OpenAI ``usage.prompt_tokens_details.cached_tokens`` or SGLang ``meta_info``."""
    if isinstance(answer, list) and answer:
        answer = answer[0]
    if not isinstance(answer, dict):
        return None, None
    meta = answer.get("meta_info")
    if isinstance(meta, dict):
        return meta.get("cached_tokens"), meta.get("prompt_tokens")
    usage = answer.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cached, usage.get("prompt_tokens")
    return None, None
