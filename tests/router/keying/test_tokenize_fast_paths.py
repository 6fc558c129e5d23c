"""Fast paths of ``router/keying/tokenize.py``: the text -> ids memo, the C-loop token-id check,
and the backend encode, each equal to the plain path (or not used)."""

from __future__ import annotations

import pytest

from router.keying.tokenize import (
    TEXT_CACHE_MIN_CHARS,
    ModelTokenizer,
    PromptError,
    _fast_encode,
    check_token_ids,
)


class _CountingTokenizer:
    """Stand-in for a loaded tokenizer: ids are character codes; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return [ord(c) for c in text]


def _loaded(entries: int) -> tuple[ModelTokenizer, _CountingTokenizer]:
    fake = _CountingTokenizer()
    tok = ModelTokenizer("unused", text_cache_entries=entries)
    tok._tok, tok._encode = fake, _fast_encode(fake)  # what _load sets
    return tok, fake


def test_memo_returns_the_tokenizers_ids_as_fresh_lists_and_evicts_the_oldest() -> None:
    tok, fake = _loaded(entries=2)
    texts = [str(i) * TEXT_CACHE_MIN_CHARS for i in range(3)]
    first = tok.encode_text(texts[0])
    first.append(-1)  # a caller changing its list must not change the memo
    assert tok.encode_text(texts[0]) == fake.encode(texts[0])
    calls = fake.calls
    tok.encode_text(texts[0])
    assert fake.calls == calls  # a hit
    tok.encode_text(texts[1])
    tok.encode_text(texts[2])  # evicts texts[0] (least recently used)
    calls = fake.calls
    assert tok.encode_text(texts[0]) == fake.encode(texts[0])[:]
    assert fake.calls == calls + 2  # a miss (+1 for the reference call above)


def test_short_texts_bypass_the_memo() -> None:
    tok, fake = _loaded(entries=8)
    tok.encode_text("hi")
    tok.encode_text("hi")
    assert fake.calls == 2


def test_token_id_check_fast_path_agrees_with_the_per_element_rules() -> None:
    assert check_token_ids([0, 5, 9], 10) == [0, 5, 9]
    for bad in ([1, True], [1, 2.0], [1, -1], [1, "2"], [1, None], [10], []):
        with pytest.raises(PromptError):
            check_token_ids(bad, 10)


class _Encoding:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class _Backend:
    def __init__(self, shift: int, truncation: object = None) -> None:
        self.shift, self.truncation, self.padding = shift, truncation, None

    def encode(self, text: str) -> _Encoding:
        return _Encoding([ord(c) + self.shift for c in text])


class _WrappedTokenizer(_CountingTokenizer):
    def __init__(self, backend: _Backend) -> None:
        super().__init__()
        self._tokenizer = backend


def test_backend_encode_only_when_it_matches_the_wrapper_and_nothing_truncates() -> None:
    same = _WrappedTokenizer(_Backend(0))
    assert _fast_encode(same) is not same.encode  # agrees on the probe: the backend is used
    assert _fast_encode(same)("abc") == same.encode("abc")
    differs = _WrappedTokenizer(_Backend(1))
    assert _fast_encode(differs) == differs.encode
    truncating = _WrappedTokenizer(_Backend(0, truncation={"max_length": 8}))
    assert _fast_encode(truncating) == truncating.encode
