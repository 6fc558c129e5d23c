"""Prompt -> token ids, exactly as the engine will tokenize it.

The router's page keys must be the engine's, so the router loads the served model's own tokenizer
and chat template (``transformers.AutoTokenizer`` from the model folder) and mirrors SGLang's
rules: ``/generate`` and ``/v1/completions`` text is ``tokenizer.encode(text)``; chat messages are
rendered with the chat template (``add_generation_prompt=True``) and the rendered text is encoded
without adding special tokens again (SGLang's ``serving_chat`` does the same). Tokenizers load
lazily, once per model folder. Requests that already carry token ids skip tokenization.
"""

from __future__ import annotations

import collections
import functools
import json
import threading
from pathlib import Path
from typing import Annotated, Any

import msgspec


class PromptError(ValueError):
    """A prompt that cannot be tokenized or holds invalid token ids (HTTP 400)."""


# Text -> ids memo: tokenizing is deterministic, and agents / chat front ends resend the same long
# system prompts and documents; a hit skips milliseconds of tokenizer work per request.
TEXT_CACHE_ENTRIES = 256
TEXT_CACHE_MIN_CHARS = 256  # short texts tokenize in microseconds: not worth a slot
TEXT_CACHE_MAX_CHARS = 1 << 17  # bounds the memo's memory (entries x this)


class ModelTokenizer:
    """One model folder's tokenizer, loaded on first use."""

    def __init__(self, path: str, text_cache_entries: int = TEXT_CACHE_ENTRIES) -> None:
        self.path = path
        self._tok: Any = None
        self._lock = threading.Lock()
        self._memo: collections.OrderedDict[str, tuple[int, ...]] = collections.OrderedDict()
        self._memo_size = text_cache_entries
        self._memo_lock = threading.Lock()  # encode may run on a worker thread (huge bodies)
        self._encode: Any = None  # text -> ids, the fastest call that gives ``encode``'s ids

    def _load(self) -> Any:
        if self._tok is None:
            with self._lock:
                if self._tok is None:
                    from transformers import AutoTokenizer

                    tok = AutoTokenizer.from_pretrained(self.path)
                    self._encode = _fast_encode(tok)
                    self._tok = tok
        return self._tok

    def load(self) -> None:
        self._load()

    @property
    def loaded(self) -> bool:
        return self._tok is not None

    @property
    def vocab_size(self) -> int:
        return len(self._load())

    def encode_text(self, text: str) -> list[int]:
        self._load()
        if not TEXT_CACHE_MIN_CHARS <= len(text) <= TEXT_CACHE_MAX_CHARS or self._memo_size <= 0:
            return list(self._encode(text))
        with self._memo_lock:
            hit = self._memo.get(text)
            if hit is not None:
                self._memo.move_to_end(text)
                return list(hit)  # a fresh list: callers may keep or change it
        ids = tuple(self._encode(text))
        with self._memo_lock:
            self._memo[text] = ids
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
        return list(ids)

    def encode_chat(
        self, messages: list[Any], tools: Any = None, template_kwargs: dict[str, Any] | None = None
    ) -> list[int]:
        tok = self._load()
        try:
            rendered = tok.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=True,
                tools=tools,
                return_dict=False,
                **(template_kwargs or {}),
            )
        except Exception as exc:  # jinja errors, bad message shapes
            raise PromptError(f"cannot apply the chat template: {exc}") from exc
        return list(tok.encode(rendered, add_special_tokens=False))


_PROBE = "Hello, world! <s> </s> [CLS] 12.5% naïve 日本語\n\tend"


def _fast_encode(tok: Any) -> Any:
    """``tok.encode`` or, when it gives the same ids, the Rust backend's ``encode`` called
    directly: the transformers wrapper (per-call truncation/padding setup, BatchEncoding) was
    ~10% of a 1,024-word encode. Used only with no truncation/padding configured on the backend
    and after the two agree on a probe with special-token strings and non-ASCII text."""
    backend = getattr(tok, "_tokenizer", None)
    if backend is None or getattr(backend, "truncation", 1) is not None or getattr(
            backend, "padding", 1) is not None:
        return tok.encode

    def encode(text: str) -> list[int]:
        return backend.encode(text).ids

    try:
        same = encode(_PROBE) == list(tok.encode(_PROBE))
    except Exception:  # an exotic backend: keep the wrapper
        same = False
    return encode if same else tok.encode


@functools.lru_cache(maxsize=64)
def model_vocab_size(path: str) -> int | None:
    """``vocab_size`` from the model folder's config.json (the engine's embedding size: token ids
    must be below it), or None when unknown. Read once per folder."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("vocab_size")
    if value is None and isinstance(config.get("text_config"), dict):
        value = config["text_config"].get("vocab_size")
    return value if isinstance(value, int) else None


def model_context_length(path: str) -> int | None:
    """``max_position_embeddings`` (or similar) from the model folder's config.json, if any."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


class TokenizerCache:
    """Model folder -> :class:`ModelTokenizer`; thread-safe, loads nothing until asked."""

    def __init__(self) -> None:
        self._by_path: dict[str, ModelTokenizer] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> ModelTokenizer:
        with self._lock:
            tok = self._by_path.get(path)
            if tok is None:
                tok = self._by_path[path] = ModelTokenizer(path)
            return tok


@functools.lru_cache(maxsize=64)
def _ids_type(vocab_size: int | None) -> Any:
    return list[Annotated[int, msgspec.Meta(ge=0, lt=vocab_size)]]


def check_token_ids(ids: object, vocab_size: int | None) -> list[int]:
    """Validate client-supplied token ids: a non-empty list of ints in ``[0, vocab_size)``."""
    if not isinstance(ids, list) or not ids:
        raise PromptError("input_ids must be a non-empty list of integers")
    # Fast path: one C pass (msgspec; strict, so bools and floats are not ints), ~4x cheaper than
    # the type set + min + max it replaced; the slow loop only names the culprit.
    try:
        msgspec.convert(ids, _ids_type(vocab_size))
        return ids
    except msgspec.ValidationError:
        pass
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise PromptError(f"invalid token id {t!r}: must be a non-negative integer")
        if vocab_size is not None and t >= vocab_size:
            raise PromptError(f"invalid token id {t}: vocabulary size is {vocab_size}")
    return ids
