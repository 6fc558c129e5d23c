"""The CPU extend attention over a cached prefix (``sglang_patch/attention_cpu.py``).

Two references: attention written out by hand (masked scores, softmax, weighted values) over a
batch of requests with random prefix and extend lengths (hypothesis), and SGLang's own stock
``_run_sdpa_forward_extend`` in a spawned interpreter (SGLang imports only after the CPU patches).
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_patch.attention_cpu import extend_attention, patch_backend

HEADS, KV_HEADS, DIM, SLOTS = 4, 2, 8, 256


class Batch:
    """Requests laid out as SGLang's extend batch: KV of every token in a pool, a request's
    slots in a ``req_to_token`` row, queries of the new tokens only, back to back."""

    def __init__(self, lengths: list[tuple[int, int]], seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.k_cache = torch.randn(SLOTS, KV_HEADS, DIM, generator=g)
        self.v_cache = torch.randn(SLOTS, KV_HEADS, DIM, generator=g)
        self.req_to_token = torch.zeros(len(lengths) + 1, SLOTS, dtype=torch.int64)
        self.rows = torch.randperm(len(lengths) + 1, generator=g)[: len(lengths)]  # pool rows
        free = torch.randperm(SLOTS, generator=g)
        used = 0
        for row, (prefix, new) in zip(self.rows.tolist(), lengths, strict=True):
            self.req_to_token[row, : prefix + new] = free[used : used + prefix + new]
            used += prefix + new
        self.prefix = torch.tensor([p for p, _ in lengths])
        self.new = torch.tensor([n for _, n in lengths])
        self.query = torch.randn(int(self.new.sum()), HEADS, DIM, generator=g)
        self.lengths = lengths

    def args(self) -> tuple[Any, ...]:
        return (self.query, torch.full_like(self.query, float("nan")), self.k_cache,
                self.v_cache, self.req_to_token, self.rows,
                self.prefix + self.new, self.prefix, self.new)

    def by_hand(self, scale: float) -> torch.Tensor:
        rows, start = [], 0
        for row, (prefix, new) in zip(self.rows.tolist(), self.lengths, strict=True):
            slots = self.req_to_token[row, : prefix + new]
            k = self.k_cache[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)  # GQA
            v = self.v_cache[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
            for i in range(new):
                q = self.query[start + i]  # [heads, dim]
                seen = prefix + i + 1  # causal: the prefix and the new tokens up to this one
                scores = torch.einsum("hd,thd->ht", q, k[:seen]) * scale
                rows.append(torch.einsum("ht,thd->hd", scores.softmax(dim=1), v[:seen]))
            start += new
        return torch.stack(rows) if rows else self.query.new_empty(0, HEADS, DIM)


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a causal self-attention extend was handed to the stock method")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 24)), min_size=1, max_size=4),
       st.integers(0, 2**16), st.sampled_from([None, 0.3]))
def test_new_rows_attend_to_the_prefix_and_causally_to_each_other(lengths, seed, scaling):
    batch = Batch(lengths, seed)
    out = extend_attention(_never, None, *batch.args(), scaling=scaling, causal=True,
                           enable_gqa=True)
    scale = DIM ** -0.5 if scaling is None else scaling
    assert torch.allclose(out, batch.by_hand(scale), atol=1e-5), lengths


def test_a_cache_of_another_dtype_is_converted_to_the_querys():
    batch = Batch([(9, 4)], 3)
    args = list(batch.args())
    args[3] = args[3].to(torch.float64)  # the value cache only
    out = extend_attention(_never, None, *args, causal=True, enable_gqa=True)
    assert torch.allclose(out, batch.by_hand(DIM ** -0.5), atol=1e-5)


def test_another_sglangs_method_is_left_unpatched():
    class Backend:
        def _run_sdpa_forward_extend(self, query, output, k_cache, v_cache):  # other params
            return "stock"

    method = Backend._run_sdpa_forward_extend
    patch_backend(Backend)
    assert Backend._run_sdpa_forward_extend is method


def test_other_attention_kinds_keep_the_stock_method():
    batch = Batch([(5, 3)], 0)
    calls = []

    def stock(*args: Any, **kwargs: Any) -> str:
        calls.append(kwargs)
        return "stock"

    assert extend_attention(stock, None, *batch.args(), causal=False) == "stock"
    assert extend_attention(stock, None, *batch.args(), causal=True,
                            sliding_window_size=4) == "stock"
    assert extend_attention(stock, None, *batch.args(), causal=True, is_cross_attn=True) == "stock"
    assert len(calls) == 3 and calls[1]["sliding_window_size"] == 4


def _against_stock(q: Any) -> None:
    try:
        from sglang_patch import cpu_compat

        applied = cpu_compat.apply("cpu")
        assert "torch-native-prefix-extend" in applied.applied, applied
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        method = TorchNativeAttnBackend._run_sdpa_forward_extend
        stock = method.__wrapped_stock__
        batch = Batch([(0, 9), (37, 5), (12, 0), (12, 1), (60, 20)], seed=7)
        cpu_compat.apply("cpu")  # again: idempotent
        assert TorchNativeAttnBackend._run_sdpa_forward_extend is method
        ours = method(None, *batch.args(), causal=True, enable_gqa=True)
        theirs = stock(None, *batch.args(), causal=True, enable_gqa=True)
        assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
        q.put((True, ""))
    except BaseException:
        q.put((False, traceback.format_exc()))


@pytest.mark.sglang
def test_same_output_as_sglangs_stock_method():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_against_stock, args=(q,))
    p.start()
    ok, detail = q.get(timeout=240)
    p.join(timeout=30)
    assert ok, detail
