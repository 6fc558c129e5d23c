"""Pure planning of a trace replay: which prompt, how many output tokens, and when (no I/O).

Scaling rules (stated in every replay's output so a reader can reproduce the load):
- Prompts come from ``radix_global.trace.synthesize_prompt`` with ``tokens_per_hash_id`` tokens
  per Mooncake block (instead of 512). ``choose_tokens_per_hash_id`` picks it so that the mean
  prompt of the replayed slice is near ``target_mean_prompt`` tokens (1-4K: big enough that prefill
  dominates a request's cost on the CPU model, small enough to run on two cores), rounded to a
  multiple of the page size so Mooncake blocks stay page-aligned.
- Prompts longer than ``max_prompt_tokens`` are cut to that many tokens (a cut prompt is still a
  prefix of the uncut one, so sharing is preserved).
- Output lengths: ``max(1, round(output_length * output_scale))``, at most ``max_output_tokens``;
  sent with ``ignore_eos`` so the engine produces exactly that many.
- Send times: ``(timestamp - first timestamp) / 1000 * time_scale`` seconds after the start.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from radix_global.trace import MOONCAKE_BLOCK_TOKENS, TraceRequest, synthesize_prompt


class PlanError(ValueError):
    """Replay options that cannot produce a valid plan (message says which)."""


@dataclass(frozen=True)
class ReplayScaling:
    tokens_per_hash_id: int
    time_scale: float = 1.0
    output_scale: float = 0.05
    max_output_tokens: int = 64
    max_prompt_tokens: int = 6144

    def __post_init__(self) -> None:
        if self.tokens_per_hash_id <= 0:
            raise PlanError("tokens_per_hash_id must be positive")
        if not self.time_scale > 0:
            raise PlanError("time_scale must be positive")
        if not self.output_scale > 0:
            raise PlanError("output_scale must be positive")
        if self.max_output_tokens < 1 or self.max_prompt_tokens < 1:
            raise PlanError("max_output_tokens and max_prompt_tokens must be >= 1")


class PlannedRequest(NamedTuple):
    position: int  # index in the replayed slice
    send_at_s: float  # seconds after the replay start (the earliest, with ``after``)
    input_ids: list[int]
    output_tokens: int
    trace: TraceRequest
    # The position of the request whose answer this prompt contains: it is sent no sooner than
    # ``think_s`` after that request ended (closed-loop turns; None: at ``send_at_s`` only).
    after: int | None = None
    think_s: float = 0.0


def choose_tokens_per_hash_id(trace: Sequence[TraceRequest], target_mean_prompt: int,
                              page_size: int = 1, max_prompt_tokens: int | None = None) -> int:
    """Tokens per Mooncake block giving a mean prompt near ``target_mean_prompt`` tokens.

    The mean is taken after the ``max_prompt_tokens`` cut, so a trace with a long tail still
    reaches the target. Result: a positive multiple of ``page_size``.
    """
    if not trace:
        raise PlanError("empty trace")
    if target_mean_prompt <= 0 or page_size <= 0:
        raise PlanError("target_mean_prompt and page_size must be positive")

    def mean_prompt(tpb: int) -> float:
        total = 0
        for req in trace:
            n = min(math.ceil(req.input_length * tpb / MOONCAKE_BLOCK_TOKENS),
                    len(req.hash_ids) * tpb)
            total += n if max_prompt_tokens is None else min(n, max_prompt_tokens)
        return total / len(trace)

    # mean_prompt is nondecreasing in tpb: take the first page multiple reaching the target.
    best = page_size
    for tpb in range(page_size, MOONCAKE_BLOCK_TOKENS * 8 + 1, page_size):
        best = tpb
        if mean_prompt(tpb) >= target_mean_prompt:
            break
    return best


def scaled_output(output_length: int, scaling: ReplayScaling) -> int:
    return max(1, min(scaling.max_output_tokens, round(output_length * scaling.output_scale)))


def plan_requests(trace: Sequence[TraceRequest], scaling: ReplayScaling) -> list[PlannedRequest]:
    """One planned request per trace line, in send-time order (ties keep file order)."""
    if not trace:
        return []
    t0 = min(r.timestamp_ms for r in trace)
    out = []
    for i, req in enumerate(trace):
        ids = synthesize_prompt(req.hash_ids, req.input_length, scaling.tokens_per_hash_id)
        ids = ids[: scaling.max_prompt_tokens]
        if not ids:
            raise PlanError(f"trace request {i} has an empty prompt (no hash ids or length 0)")
        send_at = (req.timestamp_ms - t0) / 1000.0 * scaling.time_scale
        out.append(PlannedRequest(i, send_at, ids, scaled_output(req.output_length, scaling), req))
    out.sort(key=lambda p: (p.send_at_s, p.position))
    return out


def shared_prefix_tokens(plan: Sequence[PlannedRequest], tokens_per_hash_id: int) -> int:
    """Tokens an ideal single cache could reuse: per request, the longest common prefix with any
    earlier request, in whole Mooncake blocks (an upper bound for "prefix tokens reused")."""
    seen: set[tuple[int, ...]] = set()
    total = 0
    for p in plan:
        ids = p.trace.hash_ids
        n_blocks = 0
        for k in range(1, len(ids) + 1):
            if ids[:k] in seen:
                n_blocks = k
            else:
                break
        total += min(len(p.input_ids), n_blocks * tokens_per_hash_id)
        for k in range(1, len(ids) + 1):
            seen.add(ids[:k])
    return total


def conversation_key(req: TraceRequest) -> tuple[int, ...]:
    """Requests of one conversation share their first two blocks (system prompt + first turn);
    later turns extend the earlier turn's blocks."""
    return req.hash_ids[:2]


def select_conversations(trace: Sequence[TraceRequest], k: int, min_turns: int = 3
                         ) -> list[TraceRequest]:
    """The turns of the first ``k`` conversations (by first appearance) that have at least
    ``min_turns`` turns, in trace order. Contiguous slices of the conversation trace hold few
    repeat turns (turns of one conversation are minutes apart); this keeps the multi-turn reuse
    of the whole trace in a short replay (time-compressed with ``time_scale``)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, req in enumerate(trace):
        groups.setdefault(conversation_key(req), []).append(i)
    chosen = [v for v in groups.values() if len(v) >= min_turns][:k]
    return [trace[i] for i in sorted(i for v in chosen for i in v)]


def time_scale_for(trace: Sequence[TraceRequest], duration_s: float) -> float:
    """The ``time_scale`` that makes the trace's timestamps span ``duration_s`` seconds."""
    if not trace or duration_s <= 0:
        raise PlanError("need a non-empty trace and a positive duration")
    span_s = (max(r.timestamp_ms for r in trace) - min(r.timestamp_ms for r in trace)) / 1000.0
    return duration_s / span_s if span_s > 0 else 1.0
