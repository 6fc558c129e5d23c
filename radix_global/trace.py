"""Mooncake-format traces and the ONE deterministic prompt synthesis every benchmark and test uses.

Why it lives in the core package, not under ``benchmarks/``: the product's own
``radix-global make-model`` (``sglang_patch/make_model.py``) builds its tokenizer's vocabulary
from this module's synthetic words, so a model made on any host tokenizes synthesized prompts
word for word; ``sglang_patch`` must not import the benchmarks.

A trace line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``;
each hash id stands for one 512-token block, and equal ids mean identical (chained) prefix blocks.

Synthesis contract (``synthesize_prompt``)
- Block ``h`` becomes ``tokens_per_hash_id`` token ids drawn from a PRNG seeded by ``h`` alone
  (SHA-256 of the id -> numpy PCG64; never Python's ``hash()``), so the same id gives the same
  tokens in every request, process and run, and requests sharing leading hash ids share exactly
  that token prefix.
- Lengths are scaled: ``scaled_input_length(n) = ceil(n * tokens_per_hash_id / 512)``, at most
  ``len(hash_ids) * tokens_per_hash_id``. A partial last block is the *start* of that hash id's
  full block (so a short tail is still a prefix of the full block another request may hold).
- Every token is a whole-word synthetic vocabulary entry (``SyntheticVocab``): the tiny model's
  tokenizer (``sglang_patch.make_model``) holds the words ``w0000 ...`` at consecutive ids by
  construction, so ``prompt_text`` (words joined by spaces) re-tokenizes to exactly the ids.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512
SYNTHETIC_WORD_PREFIX = "w"
SYNTHETIC_WORD_DIGITS = 4


class TraceFormatError(ValueError):
    """A trace line that is not a valid Mooncake record (message names the line)."""


class TraceRequest(NamedTuple):
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


class SyntheticVocab(NamedTuple):
    """Token ids ``first_id .. first_id + size - 1`` are the words ``synthetic_word(0..size-1)``."""

    first_id: int
    size: int

    def word(self, token_id: int) -> str:
        if not self.first_id <= token_id < self.first_id + self.size:
            raise ValueError(f"token id {token_id} is outside the synthetic vocabulary {self}")
        return synthetic_word(token_id - self.first_id)


def synthetic_word(index: int) -> str:
    """The ``index``-th synthetic word, e.g. ``w0042``; one whole tokenizer entry each."""
    if not 0 <= index < 10**SYNTHETIC_WORD_DIGITS:
        raise ValueError(f"synthetic word index {index} out of range")
    return f"{SYNTHETIC_WORD_PREFIX}{index:0{SYNTHETIC_WORD_DIGITS}d}"


# Must match the tokenizer sglang_patch.make_model builds (it imports these two constants).
SYNTHETIC_FIRST_ID = 200
SYNTHETIC_SIZE = 7992
DEFAULT_VOCAB = SyntheticVocab(SYNTHETIC_FIRST_ID, SYNTHETIC_SIZE)


def scaled_input_length(input_length: int, n_blocks: int, tokens_per_hash_id: int) -> int:
    """Trace input length scaled from 512-token blocks to ``tokens_per_hash_id``-token blocks."""
    scaled = math.ceil(input_length * tokens_per_hash_id / MOONCAKE_BLOCK_TOKENS)
    return max(0, min(scaled, n_blocks * tokens_per_hash_id))


def block_tokens(hash_id: int, tokens_per_hash_id: int, vocab: SyntheticVocab) -> list[int]:
    """The full token block of one hash id (deterministic in ``hash_id`` and the block size)."""
    digest = hashlib.sha256(f"radix-global-block:{int(hash_id)}".encode()).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))
    ids = rng.integers(vocab.first_id, vocab.first_id + vocab.size, size=tokens_per_hash_id)
    return [int(t) for t in ids]


def synthesize_prompt(
    hash_ids: Sequence[int],
    input_length: int,
    tokens_per_hash_id: int,
    vocab: SyntheticVocab = DEFAULT_VOCAB,
) -> list[int]:
    """Token ids for one trace request (see the module contract)."""
    if tokens_per_hash_id <= 0:
        raise ValueError("tokens_per_hash_id must be positive")
    length = scaled_input_length(input_length, len(hash_ids), tokens_per_hash_id)
    out: list[int] = []
    for hash_id in hash_ids:
        if len(out) >= length:
            break
        out.extend(block_tokens(hash_id, tokens_per_hash_id, vocab)[: length - len(out)])
    return out


def read_trace(path: str | Path, limit: int | None = None) -> Iterator[TraceRequest]:
    """Yield the trace's requests in file order; a malformed line raises ``TraceFormatError``."""
    with open(path, encoding="utf-8") as f:
        count = 0
        for line_no, line in enumerate(f, 1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            yield parse_trace_line(line, f"{path}:{line_no}")
            count += 1


def parse_trace_line(line: str, where: str = "<line>") -> TraceRequest:
    try:
        rec: Any = json.loads(line)
        hash_ids = tuple(int(h) for h in rec["hash_ids"])
        req = TraceRequest(float(rec["timestamp"]), int(rec["input_length"]),
                           int(rec["output_length"]), hash_ids)
    except (ValueError, KeyError, TypeError) as exc:
        raise TraceFormatError(f"{where}: not a Mooncake trace record: {exc}") from exc
    if req.input_length < 0 or req.output_length < 0:
        raise TraceFormatError(f"{where}: negative length")
    return req


class _Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def prompt_text(ids: Sequence[int], tokenizer: _Tokenizer | None = None,
                vocab: SyntheticVocab = DEFAULT_VOCAB) -> str:
    """Text that re-tokenizes to exactly ``ids`` (words joined by single spaces).

    With ``tokenizer`` given, the round trip is checked (``add_special_tokens=False``) and a
    mismatch raises ``ValueError``: a tokenizer not built by make-model would silently shift keys.
    """
    text = " ".join(vocab.word(int(t)) for t in ids)
    if tokenizer is not None:
        back = list(tokenizer.encode(text, add_special_tokens=False))
        if back != [int(t) for t in ids]:
            raise ValueError("tokenizer does not map synthetic words to their ids (make-model?)")
    return text


def block_prompt(hash_ids: Sequence[int], tokens_per_hash_id: int,
                 vocab: SyntheticVocab = DEFAULT_VOCAB) -> list[int]:
    """Token ids of ``len(hash_ids)`` whole blocks of ``tokens_per_hash_id`` tokens each (a
    synthetic prompt of exactly that length, sharing blocks with any prompt of the same ids)."""
    return synthesize_prompt(hash_ids, len(hash_ids) * MOONCAKE_BLOCK_TOKENS, tokens_per_hash_id,
                             vocab)
