"""radix_global.trace: deterministic prompt synthesis from Mooncake hash ids, and the reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix_global import trace

VOCAB = trace.DEFAULT_VOCAB
REPO = Path(__file__).resolve().parents[2]


def test_same_id_same_tokens_across_processes() -> None:
    here = trace.block_tokens(12345, 64, VOCAB)
    code = "from radix_global import trace as t; print(t.block_tokens(12345, 64, t.DEFAULT_VOCAB))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(REPO), env={"PYTHONHASHSEED": "123", "PYTHONPATH": str(REPO)})
    assert json.loads(out.stdout) == here
    assert trace.block_tokens(12346, 64, VOCAB) != here


def test_tokens_lie_in_the_synthetic_range() -> None:
    ids = trace.synthesize_prompt(list(range(50)), 50 * 512, 32)
    assert len(ids) == 1600
    assert min(ids) >= VOCAB.first_id and max(ids) < VOCAB.first_id + VOCAB.size


def test_requests_sharing_leading_ids_share_exactly_that_prefix() -> None:
    a = trace.synthesize_prompt([7, 8, 9], 3 * 512, 16)
    b = trace.synthesize_prompt([7, 8, 10], 3 * 512, 16)
    assert a[:32] == b[:32]
    assert a[32:] != b[32:]


def test_block_does_not_depend_on_position() -> None:
    assert trace.synthesize_prompt([5, 6], 1024, 16)[16:] == trace.block_tokens(6, 16, VOCAB)


def test_partial_last_block_is_the_start_of_the_full_block() -> None:
    full = trace.synthesize_prompt([1, 2], 1024, 64)
    partial = trace.synthesize_prompt([1, 2], 512 + 100, 64)  # ceil(612 * 64 / 512) = 77
    assert len(partial) == 64 + 13
    assert partial == full[: len(partial)]


def test_input_length_scaling_and_cap() -> None:
    assert trace.scaled_input_length(512, 1, 32) == 32
    assert trace.scaled_input_length(513, 2, 32) == 33  # ceil
    assert trace.scaled_input_length(10_000, 2, 32) == 64  # never beyond the listed blocks
    assert trace.synthesize_prompt([], 100, 32) == []
    with pytest.raises(ValueError):
        trace.synthesize_prompt([1], 512, 0)


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=6), st.integers(1, 64))
def test_prefix_property(hash_ids: list[int], block: int) -> None:
    whole = trace.synthesize_prompt(hash_ids, len(hash_ids) * 512, block)
    assert len(whole) == len(hash_ids) * block
    for k in range(1, len(hash_ids) + 1):
        assert trace.synthesize_prompt(hash_ids[:k], k * 512, block) == whole[: k * block]


def test_read_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
            {"timestamp": 17, "input_length": 10, "output_length": 1, "hash_ids": [3]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    reqs = list(trace.read_trace(path))
    assert reqs == [trace.TraceRequest(0.0, 600, 5, (1, 2)), trace.TraceRequest(17.0, 10, 1, (3,))]
    assert list(trace.read_trace(path, limit=1)) == reqs[:1]


BAD_LINES = [
    '{"timestamp": 0}',
    "not json",
    '{"timestamp":0,"input_length":-1,"output_length":1,"hash_ids":[]}',
    '{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":"x"}',
]


@pytest.mark.parametrize("line", BAD_LINES)
def test_malformed_line_is_a_typed_error_naming_the_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(trace.TraceFormatError, match=r"bad\.jsonl:1"):
        list(trace.read_trace(path))


def test_real_trace_first_lines_parse() -> None:
    path = REPO.parent / "shared" / "traces" / "conversation_trace.jsonl"
    if not path.exists():
        pytest.fail(f"the shared Mooncake trace is missing at {path}")
    reqs = list(trace.read_trace(path, limit=50))
    assert len(reqs) == 50 and all(r.hash_ids for r in reqs)
    first = reqs[0]
    ids = trace.synthesize_prompt(first.hash_ids, first.input_length, 16)
    assert len(ids) == trace.scaled_input_length(first.input_length, len(first.hash_ids), 16) > 0


class _WordTokenizer:
    """A stand-in for the make-model tokenizer (the real one is tested in test_make_model)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [VOCAB.first_id + int(w[1:]) for w in text.split()]


def test_prompt_text_round_trip() -> None:
    ids = trace.synthesize_prompt([3, 4], 1024, 32)
    text = trace.prompt_text(ids, _WordTokenizer())
    assert text.split()[0] == VOCAB.word(ids[0]) and len(text.split()) == len(ids)
    with pytest.raises(ValueError):
        trace.prompt_text([5], _WordTokenizer())  # id 5 is not a synthetic word


def test_prompt_text_detects_a_disagreeing_tokenizer() -> None:
    class Shifted(_WordTokenizer):
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [t + 1 for t in super().encode(text)]

    with pytest.raises(ValueError, match="make-model"):
        trace.prompt_text(trace.synthesize_prompt([3], 512, 8), Shifted())
