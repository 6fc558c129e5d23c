"""The cache-pressure scenario's configuration and plans (pure; no I/O but reading the files).

``benchmarks/data/pressure.toml`` fixes the cache sizes, both workloads and their load sweeps
(issue 15); :func:`load_config` reads it into one frozen :class:`PressureConfig`. Plans are lists
of :class:`~radix_global_tools.replay.plan.PlannedRequest`, replayed open-loop by
``radix_global_tools/replay/client.py``:

- ``conversations``: the multi-turn conversations of the Mooncake trace, as ``make bench`` plans
  them (``radix_global_tools/replay/plan.py``), with more conversations so that their turns
  interleave; a load point sends the same requests over ``duration_s``.
- ``agents``: a few long shared system prompts; sessions start as a Poisson process (the same
  draws at every load point, scaled by the rate), each runs 3-6 turns, and turn k's prompt is
  the system prompt, the user messages 0..k and the fixed answers 0..k-1 (fixed tokens: the
  plan is written before the model answers). With ``think_after_answer`` a turn is sent
  ``think_s`` after the previous turn's answer ended, as a user or an agent loop would (closed
  loop within a session, open-loop session starts); without it ``think_s`` after the previous
  turn was sent, answered or not, which under a queue sends prompts whose "previous answer" does
  not exist yet and feeds the queue that delayed it (``docs/benchmarks-archive.md``, run 9).
"""

from __future__ import annotations

import random
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from benchmarks.harness.paths import DATA
from benchmarks.harness.reuse import PageTrie
from radix_global.trace import TraceRequest, block_prompt, read_trace
from radix_global_tools.replay.plan import (
    PlannedRequest,
    ReplayScaling,
    choose_tokens_per_hash_id,
    plan_requests,
    select_conversations,
    time_scale_for,
)

DEFAULT_CONFIG = DATA / "pressure.toml"
SYSTEM_BLOCK_TOKENS = 256  # a system prompt is whole blocks of this many tokens


class PressureConfigError(ValueError):
    """The scenario file is missing a key, has an unknown one or a value out of range."""


@dataclass(frozen=True)
class Conversations:
    conversations: int
    min_turns: int
    target_mean_prompt: int
    max_prompt_tokens: int
    output_scale: float
    max_output_tokens: int
    durations_s: tuple[float, ...]


@dataclass(frozen=True)
class Agents:
    system_prompts: tuple[int, ...]
    sessions: int
    min_turns: int
    max_turns: int
    message_tokens: int
    answer_tokens: int
    think_s: float
    think_after_answer: bool  # the next turn waits for the answer (else only for think_s)
    rates: tuple[float, ...]
    seed: int


@dataclass(frozen=True)
class Demo:
    """``make demo``: the conversations workload, fewer of them, at one load point."""

    conversations: int
    duration_s: float


@dataclass(frozen=True)
class PressureConfig:
    engines: int
    page_size: int
    device_tokens: int
    hicache_ratio: float
    pool_capacity_gb: float
    ttft_slo_s: float
    tbt_slo_s: float
    conversations: Conversations
    agents: Agents
    demo: Demo

    @property
    def local_tokens(self) -> int:
        """One engine's local capacity: the host tier (write-through keeps the device pool's
        pages there too)."""
        return int(self.device_tokens * self.hicache_ratio)


def _build(cls: type, table: object, where: str) -> object:
    if not isinstance(table, dict):
        raise PressureConfigError(f"{where}: expected a table")
    names = {f.name for f in fields(cls)}
    missing, unknown = names - table.keys(), table.keys() - names
    if missing or unknown:
        raise PressureConfigError(f"{where}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}
    return cls(**values)


def load_config(path: str | Path = DEFAULT_CONFIG) -> PressureConfig:
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    try:
        conv = _build(Conversations, raw.pop("conversations", None), "[conversations]")
        agents = _build(Agents, raw.pop("agents", None), "[agents]")
        demo = _build(Demo, raw.pop("demo", None), "[demo]")
    except TypeError as exc:
        raise PressureConfigError(str(exc)) from exc
    cfg = _build(PressureConfig, {**raw, "conversations": conv, "agents": agents, "demo": demo},
                 str(path))
    assert isinstance(cfg, PressureConfig)
    a = cfg.agents
    longest_agent = max(a.system_prompts, default=0) + a.max_turns * (
        a.message_tokens + a.answer_tokens)
    if (cfg.device_tokens < max(cfg.conversations.max_prompt_tokens, longest_agent)
            or cfg.hicache_ratio <= 1
            or not cfg.conversations.durations_s or not a.rates
            or not 1 <= a.min_turns <= a.max_turns or min(a.rates) <= 0
            or min(cfg.conversations.durations_s) <= 0 or a.sessions < 1
            or not a.system_prompts or cfg.demo.conversations < 1 or cfg.demo.duration_s <= 0
            or any(n <= 0 or n % SYSTEM_BLOCK_TOKENS for n in a.system_prompts)):
        raise PressureConfigError(
            f"{path}: need device_tokens >= the longest prompt of either workload, "
            "hicache_ratio > 1, a non-empty positive load sweep per workload, sessions >= 1, "
            "1 <= min_turns <= max_turns, a demo of >= 1 conversation over > 0 s and system "
            "prompts of whole "
            f"{SYSTEM_BLOCK_TOKENS}-token blocks")
    return cfg


def conversation_plan(c: Conversations, trace_path: str | Path, page_size: int,
                      duration_s: float) -> tuple[list[PlannedRequest], ReplayScaling]:
    trace = select_conversations(list(read_trace(trace_path)), c.conversations, c.min_turns)
    tpb = choose_tokens_per_hash_id(trace, c.target_mean_prompt, page_size, c.max_prompt_tokens)
    scaling = ReplayScaling(tpb, time_scale_for(trace, duration_s), c.output_scale,
                            c.max_output_tokens, c.max_prompt_tokens)
    return plan_requests(trace, scaling), scaling


def agent_plan(a: Agents, rate: float) -> list[PlannedRequest]:
    rng = random.Random(a.seed)
    systems = [block_prompt([80_000 + 100 * i + b for b in range(n // SYSTEM_BLOCK_TOKENS)],
                            SYSTEM_BLOCK_TOKENS) for i, n in enumerate(a.system_prompts)]
    plan: list[PlannedRequest] = []
    start = 0.0
    for s in range(a.sessions):
        start += rng.expovariate(1.0) / rate
        ids = list(systems[s % len(systems)])
        for k in range(rng.randint(a.min_turns, a.max_turns)):
            if k:
                ids += block_prompt([5_000_000 + 1000 * s + 2 * k - 1], a.answer_tokens)
            ids += block_prompt([5_000_000 + 1000 * s + 2 * k], a.message_tokens)
            at = start + k * a.think_s  # the earliest: every answer instant
            trace = TraceRequest(at * 1000.0, len(ids), a.answer_tokens, ())
            after = len(plan) - 1 if k and a.think_after_answer else None
            plan.append(PlannedRequest(len(plan), at, list(ids), a.answer_tokens, trace,
                                       after, a.think_s))
    plan.sort(key=lambda p: (p.send_at_s, p.position))
    return plan


def working_set_tokens(prompts: list[list[int]], page_size: int) -> int:
    """Distinct whole pages over all prompts, in tokens: what a cache holding everything holds."""
    trie = PageTrie(page_size)
    for ids in prompts:
        trie.add(ids)
    return len(trie) * page_size
