"""Bootstrap a worker's prefill model by a short profiling run when it joins.

The default prior of :class:`router.prefill_model.PrefillModel` is GPU-like; on a CPU engine real
prefills are ~50x slower, so until refitted the cost model thinks a cached prefix saves almost
nothing. Refitting online from FIFO-inferred service times does not fix it: a batching engine's
waiting time lands in the fixed term (seconds per request), so every queued request looks like
seconds of queue and the policy spreads conversations away from their cache. A few timed
``/generate`` calls with ``max_new_tokens=1`` at the :func:`profile_plan` points (a cached prefix
sent once beforehand) measure the worker's own curve instead.

:func:`fit_profile` is pure; :func:`profile_worker` does the HTTP calls (bounded, sequential).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

import httpx
import numpy as np

from router.prefill_model import PrefillModel, ProfilePoint, profile_plan

log = logging.getLogger("radix_global.router")

_K = 1000.0
_TOKEN_BASE = 100  # ids from here on: clear of the special tokens of common vocabularies
_TOKEN_SPAN = 4000  # and below the smallest vocabulary we expect (tiny model: 8,192)


class ProfileSample(NamedTuple):
    input_tokens: int
    prefix_tokens: int
    seconds: float


def fit_profile(samples: Sequence[ProfileSample], **model_kw: float) -> PrefillModel:
    """A model whose prior is ``t = fixed + per_token * m`` fitted (non-negative) on ``samples``,
    with the attention terms scaled from the measured per-token cost (a 1k-token context adds
    1% per new token). Two free coefficients: robust with a handful of noisy points."""
    good = [s for s in samples if np.isfinite(s.seconds) and s.seconds > 0 and s.input_tokens > 0]
    if len(good) < 2:
        raise ValueError("need at least two valid profile samples")
    m = np.array([(s.input_tokens - s.prefix_tokens) / _K for s in good])
    t = np.array([s.seconds for s in good])
    a = np.stack([np.ones_like(m), m], axis=1) / t[:, None]  # relative error
    (fixed, per_k), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if per_k <= 0:  # no length dependence resolved: all of it is per token at the mean length
        per_k, fixed = float(np.mean(t / np.maximum(m, 1e-3))), 0.0
    fixed = max(0.0, float(fixed))
    per_k = float(per_k)
    attention = 0.01 * per_k
    return PrefillModel(prior=(fixed, per_k, attention, attention / 2), **model_kw)  # type: ignore[arg-type]


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(_TOKEN_BASE, _TOKEN_BASE + _TOKEN_SPAN, size=n)]


async def _generate(client: httpx.AsyncClient, url: str, ids: list[int], timeout_s: float
                    ) -> float:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "stream": False}
    t0 = time.monotonic()
    resp = await client.post(f"{url}/generate", json=body, timeout=timeout_s)
    resp.raise_for_status()
    return time.monotonic() - t0


async def profile_worker(client: httpx.AsyncClient, url: str, page_size: int,
                         max_input_tokens: int = 1024, sizes: int = 3,
                         timeout_s: float = 120.0, seed: int | None = None
                         ) -> list[ProfileSample]:
    """Time one 1-token generation per :func:`profile_plan` point on the worker at ``url``.
    Every point uses fresh random token ids (``seed`` None: new ones on every run, so a cache
    left over from an earlier run cannot make a cold point warm); a point with a prefix sends
    the prefix alone first so that the timed call finds it cached."""
    rng = np.random.default_rng(seed)
    plan: list[ProfilePoint] = profile_plan(max_input_tokens, page_size, sizes)
    samples: list[ProfileSample] = []
    await _generate(client, url, _ids(rng, page_size * 2), timeout_s)  # first-call warm-up
    for point in plan:
        ids = _ids(rng, point.input_tokens)
        if point.prefix_tokens > 0:
            await _generate(client, url, ids[: point.prefix_tokens], timeout_s)
        seconds = await _generate(client, url, ids, timeout_s)
        samples.append(ProfileSample(point.input_tokens, point.prefix_tokens, seconds))
    return samples
