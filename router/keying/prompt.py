"""Where the prompt is in each typed request body (``router/keying/request_body.py``), how to
turn it into token ids, and what the router reads back from an engine's answer."""

from __future__ import annotations

from typing import Any

from router.keying.request_body import ChatBody, RequestBody, first_prompt
from router.keying.tokenize import ModelTokenizer, check_token_ids


def prompt_token_ids(body: RequestBody, tok: ModelTokenizer | None, vocab_size: int | None
                     ) -> list[int] | None:
    """Token ids of the (first) prompt; None when text must be tokenized but no tokenizer is
    available (the request is then routed without cache information and counted)."""
    if isinstance(body, ChatBody):
        if tok is None:
            return None
        return tok.encode_chat(body.messages, tools=body.tools,
                               template_kwargs=body.chat_template_kwargs)
    first = first_prompt(body.prompt_field())
    if isinstance(first, list):
        return check_token_ids(first, vocab_size)
    return tok.encode_text(first) if tok is not None else None


def engine_storage_tokens(answer: Any) -> int | None:
    """Prompt tokens the engine loaded from its L3 storage (SGLang ``meta_info``
    ``cached_tokens_details.storage``; SGLang sends no details when nothing was cached, which is
    0 here); None when the answer does not say (OpenAI answers carry no such detail)."""
    meta = _meta_info(answer)
    if meta is None:
        return None
    details = meta.get("cached_tokens_details")
    if details is None and meta.get("cached_tokens") == 0:
        return 0
    value = details.get("storage") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def engine_cached_tokens(answer: Any) -> tuple[int | None, int | None]:
    """(cached prompt tokens, prompt tokens) from an engine answer or a final stream chunk:
    OpenAI ``usage.prompt_tokens_details.cached_tokens`` or SGLang ``meta_info``."""
    answer = _first(answer)
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


CACHE_TIERS = ("device", "host", "storage")  # SGLang's ``cached_tokens_details`` keys


def engine_cached_tiers(answer: Any) -> dict[str, int] | None:
    """The engine's cached prompt tokens by tier (``device``, ``host``, ``storage``) from SGLang
    ``meta_info.cached_tokens_details``, or from an OpenAI answer's ``sglext`` (SGLang's
    ``return_cached_tokens_details``); all 0 when it reports none cached; None when the answer
    does not split them (another engine, or details not asked for)."""
    meta = _meta_info(answer)
    if meta is not None:
        cached, details = meta.get("cached_tokens"), meta.get("cached_tokens_details")
    else:
        cached, _ = engine_cached_tokens(answer)
        ext = answer.get("sglext") if isinstance(answer, dict) else None
        details = ext.get("cached_tokens_details") if isinstance(ext, dict) else None
    if details is None and cached == 0:
        return dict.fromkeys(CACHE_TIERS, 0)
    if not isinstance(details, dict):
        return None
    tiers = {t: details.get(t, 0) for t in CACHE_TIERS}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
               for v in tiers.values()):
        return None
    return tiers


def engine_completion_tokens(answer: Any) -> int | None:
    """Output tokens from an engine answer or final stream chunk (OpenAI ``usage`` or SGLang
    ``meta_info``); None when it does not say."""
    meta = _meta_info(answer)
    if meta is not None:
        value = meta.get("completion_tokens")
    else:
        first = _first(answer)
        usage = first.get("usage") if isinstance(first, dict) else None
        value = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _meta_info(answer: Any) -> dict[str, Any] | None:
    """SGLang's ``meta_info`` of an answer (a batch's first) or of a final stream event."""
    answer = _first(answer)
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    return meta if isinstance(meta, dict) else None


def _first(answer: Any) -> Any:
    """A batch answer's first prompt's; any other answer as it is."""
    return answer[0] if isinstance(answer, list) and answer else answer
