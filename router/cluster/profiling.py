"""Bootstrap a worker's prefill model by a short profiling run when it joins.

The default prior of :class:`router.routing.prefill_model.PrefillModel` is GPU-like; on a CPU
engine real prefills are ~50x slower, so until refitted the cost model thinks a cached prefix saves
almost
nothing. Refitting online from FIFO-inferred service times does not fix it: a batching engine's
waiting time lands in the fixed term (seconds per request), so every queued request looks like
seconds of queue and the policy spreads conversations away from their cache. A few timed
``/generate`` calls with ``max_new_tokens=1`` at the :func:`profile_plan` points (a cached prefix
sent once beforehand) measure the worker's own curve instead. An engine without SGLang's
``/generate`` (vLLM) is profiled the same way through OpenAI ``/v1/completions`` with a token-id
``prompt`` and ``max_tokens=1`` (``model`` given).

:func:`fit_profile` is pure; :func:`profile_worker` does the HTTP calls (bounded, sequential).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

import httpx
import numpy as np

from router.routing.prefill_model import PrefillModel, ProfilePoint, profile_plan

log = logging.getLogger("radix_global.router")

_K = 1000.0
_TOKEN_BASE = 100  # ids from here on: clear of the special tokens of common vocabularies
_TOKEN_SPAN = 4000  # and below the smallest vocabulary we expect (tiny model: 8,192)


class ProfileSample(NamedTuple):
    input_tokens: int
    prefix_tokens: int
    seconds: float


def fit_profile(samples: Sequence[ProfileSample], **model_kw: float) -> PrefillModel:
    """A model whose prior is ``t = fixed + per_token * m + attention * m * (p + m/2)`` fitted
    on ``samples`` (``docs/interfaces.md``, "Routing policies", "Profile fit"): the causal attention
    of ``m`` new tokens over ``p`` cached ones and each other is the one superlinear term, so three
    non-negative coefficients describe the curve and stay identifiable with a handful of noisy
    points. Samples that leave the attention term at 0 (a linear curve) get 1% of ``per_token``
    per thousand tokens of context."""
    good = [s for s in samples if np.isfinite(s.seconds) and s.seconds > 0 and s.input_tokens > 0]
    if len(good) < 2:
        raise ValueError("need at least two valid profile samples")
    m = np.array([(s.input_tokens - s.prefix_tokens) / _K for s in good])
    p = np.array([s.prefix_tokens / _K for s in good])
    t = np.array([s.seconds for s in good])
    x = np.stack([np.ones_like(m), m, m * (p + m / 2)], axis=1) / t[:, None]  # relative error
    fixed, per_k, attention = _nonnegative_lstsq(x, np.ones_like(t))
    if per_k <= 0 and attention <= 0:  # no length dependence: all of it per token at the mean
        per_k, fixed = float(np.mean(t / np.maximum(m, 1e-3))), 0.0
    if attention <= 0:
        attention = 0.01 * per_k
    return PrefillModel(prior=(fixed, per_k, attention, attention / 2), **model_kw)  # type: ignore[arg-type]


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> tuple[float, ...]:
    """``argmin |a x - b|`` over ``x >= 0`` for a few columns: the best unconstrained solution
    over every subset of columns that comes out non-negative (the optimum is one of them)."""
    cols = a.shape[1]
    best: tuple[float, np.ndarray] = (float("inf"), np.zeros(cols))
    for subset in range(1, 1 << cols):
        idx = [j for j in range(cols) if subset >> j & 1]
        sol, *_ = np.linalg.lstsq(a[:, idx], b, rcond=None)
        if np.all(sol >= 0) and np.all(np.isfinite(sol)):
            x = np.zeros(cols)
            x[idx] = sol
            err = float(np.sum((a @ x - b) ** 2))
            if err < best[0]:
                best = (err, x)
    return tuple(float(v) for v in best[1])


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(_TOKEN_BASE, _TOKEN_BASE + _TOKEN_SPAN, size=n)]


async def _generate(client: httpx.AsyncClient, url: str, ids: list[int], timeout_s: float,
                    model: str | None = None) -> float:
    body: dict[str, object]
    if model is None:
        path = "/generate"
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "stream": False}
    else:
        path = "/v1/completions"
        body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
    t0 = time.monotonic()
    resp = await client.post(f"{url}{path}", json=body, timeout=timeout_s)
    resp.raise_for_status()
    return time.monotonic() - t0


async def profile_worker(client: httpx.AsyncClient, url: str, page_size: int,
                         max_input_tokens: int = 2048, sizes: int = 3,
                         timeout_s: float = 120.0, seed: int | None = None,
                         model: str | None = None) -> list[ProfileSample]:
    """Time one 1-token generation per :func:`profile_plan` point on the worker at ``url``
    (SGLang ``/generate``; OpenAI ``/v1/completions`` of ``model`` when ``model`` is given).
    Every point uses fresh random token ids (``seed`` None: new ones on every run, so a cache
    left over from an earlier run cannot make a cold point warm); a point with a prefix sends
    the prefix alone first so that the timed call finds it cached."""
    rng = np.random.default_rng(seed)
    plan: list[ProfilePoint] = profile_plan(max_input_tokens, page_size, sizes)
    samples: list[ProfileSample] = []
    await _generate(client, url, _ids(rng, page_size * 2), timeout_s, model)  # warm-up
    for point in plan:
        ids = _ids(rng, point.input_tokens)
        if point.prefix_tokens > 0:
            await _generate(client, url, ids[: point.prefix_tokens], timeout_s, model)
        seconds = await _generate(client, url, ids, timeout_s, model)
        samples.append(ProfileSample(point.input_tokens, point.prefix_tokens, seconds))
    return samples


def inherited_model(peers: Sequence[PrefillModel]) -> PrefillModel:
    """A fresh model whose prior is the mean fitted curve of ``peers`` (same model, same
    namespace): the joining worker's own observations then refit a copy, never a peer's model."""
    if not peers:
        raise ValueError("need at least one peer model")
    coef = np.mean(np.array([p.coef for p in peers]), axis=0)
    return PrefillModel(prior=tuple(float(c) for c in coef))


class ProfileBook:
    """Which worker of which namespace has its own fitted prefill profile. Pure bookkeeping.

    A worker without one yet (profiling pending, failed or off) is priced with the mean fitted
    curve of its profiled peers in the same namespace (:func:`inherited_model`) instead of the
    GPU-like default prior, which would make it look ~50x faster than its CPU peers and draw
    every request to it while its own profile runs.
    """

    def __init__(self) -> None:
        self._namespace: dict[str, str] = {}  # worker id -> namespace
        self._fitted: dict[str, PrefillModel] = {}  # worker id -> its own profiled model

    def joined(self, worker_id: str, namespace: str) -> PrefillModel | None:
        """Record a joining worker; the model to price it with until its own profile is fitted
        (None: no profiled peer, keep the default prior)."""
        self._namespace[worker_id] = namespace
        self._fitted.pop(worker_id, None)
        return self._inheritance(namespace)

    def fitted(self, worker_id: str, model: PrefillModel) -> dict[str, PrefillModel]:
        """Record ``worker_id``'s own profile; returns the new inherited model of every other
        worker of its namespace that has none (they follow the mean of the profiled peers)."""
        namespace = self._namespace.get(worker_id)
        if namespace is None:
            return {}
        self._fitted[worker_id] = model
        heirs = [w for w, ns in self._namespace.items()
                 if ns == namespace and w not in self._fitted]
        if not heirs:
            return {}
        out: dict[str, PrefillModel] = {}
        for w in heirs:  # one copy each: each refits on its own observations
            inherited = self._inheritance(namespace)
            assert inherited is not None  # worker_id itself is a fitted peer
            out[w] = inherited
        return out

    def left(self, worker_id: str) -> None:
        self._namespace.pop(worker_id, None)
        self._fitted.pop(worker_id, None)

    def has_own(self, worker_id: str) -> bool:
        return worker_id in self._fitted

    def _inheritance(self, namespace: str) -> PrefillModel | None:
        peers = [m for w, m in sorted(self._fitted.items()) if self._namespace.get(w) == namespace]
        return inherited_model(peers) if peers else None
