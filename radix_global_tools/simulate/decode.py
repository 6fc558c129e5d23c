"""Simulated decode: continuous batching with a KV budget, time between tokens from a profile.

One decode step generates one token for every request in the batch and takes

    step_s(B, S) = step_fixed_s + step_per_request_s * B + step_per_context_token_s * S

for a batch of ``B`` requests whose contexts sum to ``S`` tokens (weights read once per step,
per-request compute, and the attention reads of every cached token). A request joins the batch
at the first step boundary after it arrives (continuous batching) and leaves after its last
token; it holds its prompt plus its whole output of KV while it decodes, and waits (FIFO) when
that does not fit. A prefill run on the same instance (co-located prefill and decode) stalls the
batch for its whole duration, as a non-chunked prefill does.

Pure and lazy: :meth:`DecodeInstance.advance` jumps from one batch change to the next with the
closed form of ``n`` steps (``S`` grows by ``B`` per step), so its cost is per request, not per
token.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class DecodeProfile:
    """The decode side of a hardware profile (times in seconds, sizes in tokens)."""

    step_fixed_s: float = 0.02
    step_per_request_s: float = 0.0
    step_per_context_token_s: float = 0.0
    kv_tokens_per_instance: int = 1_000_000

    def step_s(self, batch: int, context_tokens: int) -> float:
        return (self.step_fixed_s + self.step_per_request_s * batch
                + self.step_per_context_token_s * context_tokens)

    def steps_s(self, n: int, batch: int, context_tokens: int) -> float:
        """``n`` steps of an unchanged batch starting at ``context_tokens``: each step adds one
        token to every request's context."""
        return (n * self.step_s(batch, context_tokens)
                + self.step_per_context_token_s * batch * n * (n - 1) / 2)

    def whole_steps_within(self, seconds: float, batch: int, context_tokens: int) -> int:
        """The most steps of an unchanged batch that end within ``seconds``."""
        if seconds <= 0:
            return 0
        a = self.step_s(batch, context_tokens)
        c = self.step_per_context_token_s * batch / 2
        if c <= 0:
            n = int(seconds / a)
        else:  # c n^2 + (a - c) n - seconds <= 0
            b = a - c
            n = int((-b + math.sqrt(b * b + 4 * c * seconds)) / (2 * c))
        # float rounding at the boundary: settle on the exact answer
        while n > 0 and self.steps_s(n, batch, context_tokens) > seconds:
            n -= 1
        while self.steps_s(n + 1, batch, context_tokens) <= seconds:
            n += 1
        return n


class Decoded(NamedTuple):
    """A request that finished decoding (or could never fit: ``finish_s`` is inf)."""

    request_id: str
    ready_s: float  # its KV arrived at the instance
    start_s: float  # it joined the batch
    finish_s: float  # its last token


class _Active(NamedTuple):
    end_step: int  # the global step count at which its last token is out
    request_id: str
    context_at_join: int
    join_step: int
    ready_s: float
    start_s: float


class _Waiting(NamedTuple):
    request_id: str
    ready_s: float
    context_tokens: int
    steps: int
    kv_tokens: int


class DecodeInstance:
    """One decode instance (or the decode side of a co-located one).

    Contract: calls come in time order (``join``/``stall``/``advance`` with non-decreasing
    times); finished requests are returned by ``advance``/``drain`` exactly once."""

    def __init__(self, profile: DecodeProfile) -> None:
        self.profile = profile
        self.clock = 0.0  # the last step boundary (or idle time) reached
        self.steps = 0  # steps run so far
        self._active: list[_Active] = []  # heap by end_step
        self._context = 0  # summed context of the batch at ``self.steps``
        self._kv_used = 0
        self._kv: dict[str, int] = {}
        self._waiting: deque[_Waiting] = deque()
        self._stalls: deque[tuple[float, float]] = deque()  # (start, seconds), in time order
        self._done: list[Decoded] = []

    @property
    def batch(self) -> int:
        return len(self._active)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def kv_used_tokens(self) -> int:
        return self._kv_used

    @property
    def kv_promised_tokens(self) -> int:
        """KV held by the batch and by the requests queued for it."""
        return self._kv_used + sum(w.kv_tokens for w in self._waiting)

    def step_s(self) -> float:
        """The time of the next step of the batch as it is now (0 when idle)."""
        return self.profile.step_s(self.batch, self._context) if self._active else 0.0

    def join(self, now: float, request_id: str, context_tokens: int, steps: int) -> None:
        """A request whose prompt KV (``context_tokens``) is here at ``now`` and needs
        ``steps`` more tokens (its first came from prefill)."""
        self._step_to(now)
        need = context_tokens + steps
        if need > self.profile.kv_tokens_per_instance:
            self._done.append(Decoded(request_id, now, now, math.inf))
            return
        self._waiting.append(_Waiting(request_id, now, context_tokens, steps, need))
        if self._active and self.clock < now:
            self._run(1)  # the step in progress ends before the newcomer joins
        self.clock = max(self.clock, now)
        self._admit()

    def stall(self, start: float, seconds: float) -> None:
        """A prefill on this instance from ``start`` for ``seconds``: no decode step runs then."""
        self._stalls.append((start, seconds))

    def advance(self, now: float) -> list[Decoded]:
        """Run every step that ends by ``now``; return the requests finished so far."""
        self._step_to(now)
        done, self._done = self._done, []
        return done

    def _step_to(self, now: float) -> None:
        while True:
            stall_at = self._stalls[0][0] if self._stalls else math.inf
            horizon = min(now, stall_at)
            if self._active:
                n_end = self._active[0].end_step - self.steps
                if self.clock + self.profile.steps_s(n_end, self.batch, self._context) <= horizon:
                    self._run(n_end)
                    continue
                n = self.profile.whole_steps_within(horizon - self.clock, self.batch,
                                                    self._context)
                if n:
                    self._run(n)
            if stall_at > now:
                break
            start, seconds = self._stalls.popleft()
            if self._active and self.clock < start:
                self._run(1)  # the prefill waits for the step in progress
            self.clock = max(self.clock, start) + seconds
        self._admit()
        if not self._active:
            self.clock = max(self.clock, now)

    def drain(self) -> list[Decoded]:
        """Run to the end: every request still here finishes."""
        done: list[Decoded] = []
        while self._active or self._waiting or self._stalls:
            end = self._stalls[-1][0] if self._stalls else self.clock
            done += self.advance(max(end, self.clock) + 3600.0)
        return done + self.advance(self.clock)

    def _run(self, n: int) -> None:
        """``n`` steps of the current batch; requests whose last token came leave."""
        self.clock += self.profile.steps_s(n, self.batch, self._context)
        self.steps += n
        self._context += n * self.batch
        while self._active and self._active[0].end_step <= self.steps:
            a = heapq.heappop(self._active)
            self._context -= a.context_at_join + (self.steps - a.join_step)
            self._kv_used -= self._kv.pop(a.request_id)
            self._done.append(Decoded(a.request_id, a.ready_s, a.start_s, self.clock))
        self._admit()

    def _admit(self) -> None:
        while self._waiting and \
                self._kv_used + self._waiting[0].kv_tokens <= self.profile.kv_tokens_per_instance:
            w = self._waiting.popleft()
            if w.steps <= 0:
                self._done.append(Decoded(w.request_id, w.ready_s, self.clock, self.clock))
                continue
            self._kv_used += w.kv_tokens
            self._kv[w.request_id] = w.kv_tokens
            self._context += w.context_tokens
            heapq.heappush(self._active, _Active(self.steps + w.steps, w.request_id,
                                                 w.context_tokens, self.steps, w.ready_s,
                                                 self.clock))
