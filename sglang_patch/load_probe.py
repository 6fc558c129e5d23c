"""Measure how fast this worker's engine loads a pool run (``WorkerInfo.pool_load_Bps``).

The router prices a fetch as bytes over a bandwidth. The pool's own read speed is rarely the
bottleneck: SGLang's storage prefetch, the backend's reads and checksums and the host-to-device
copy are, and on a CPU engine they run at ~25 MB/s against the router's 10 GB/s default
(``docs/benchmarks.md``, "One engine alone"). So the launch wrapper measures the whole path once,
before the worker registers (``docs/interfaces.md``, "Worker registration"):

0. a short random prompt warms the engine up (its first request pays one-time start-up costs,
   seconds on a CPU engine, that would otherwise count as the prompt's compute);
1. a random prompt is computed (``max_new_tokens=1``): its pages are written through to the pool;
2. the engine's device and host caches are flushed (nothing else is cached: it has not joined);
3. the same prompt again: the engine loads it from the pool and reports ``storage`` tokens.

:func:`load_rate_Bps` is the pure arithmetic; :func:`probe_load` does the bounded HTTP calls.
Every failure is a :class:`LoadProbeError`: the caller then registers without a rate.
"""

from __future__ import annotations

import random
import time
from typing import Any, NamedTuple

import httpx

_TOKEN_BASE = 100  # clear of the special tokens of common vocabularies
_TOKEN_SPAN = 4000  # and below the smallest vocabulary we expect (tiny model: 8,192)
_WARMUP_TOKENS = 32


class LoadProbeError(RuntimeError):
    """The probe could not measure a load (an engine error, or nothing came from the pool)."""


class LoadSample(NamedTuple):
    prompt_tokens: int
    cold_s: float  # the first request: everything computed
    loaded_s: float  # the second request, after the flush
    storage_tokens: int  # what the engine reported loading from the pool in it


def load_rate_Bps(sample: LoadSample, kv_bytes_per_token: float) -> float:
    """KV bytes per second of the load: the second request's time, less the share of the cold
    time that its remainder (the tokens not loaded, always at least the last) still computed."""
    if sample.storage_tokens <= 0 or sample.prompt_tokens <= 0:
        raise LoadProbeError("the engine loaded nothing from the pool")
    if not (sample.cold_s > 0 and sample.loaded_s > 0 and kv_bytes_per_token > 0):
        raise LoadProbeError(f"unusable sample {sample}")
    computed = max(0, sample.prompt_tokens - sample.storage_tokens)
    load_s = sample.loaded_s - sample.cold_s * computed / sample.prompt_tokens
    # Noise can leave nothing or less of the request once the compute is taken out: a tenth
    # of it is the floor, so a fast load is priced fast but never as free.
    load_s = max(load_s, sample.loaded_s * 0.1)
    return sample.storage_tokens * kv_bytes_per_token / load_s


def probe_load(url: str, tokens: int, kv_bytes_per_token: float, *, attempts: int = 3,
               settle_s: float = 1.0, timeout_s: float = 120.0,
               client: httpx.Client | None = None) -> tuple[float, LoadSample]:
    """Run the probe against the engine at ``url`` (healthy, empty, not yet registered) and
    return the rate and its sample. The write-through to the pool runs behind the first request,
    so a second request that found too little in the pool, or a flush the engine refused (it
    does while a write-back is under way), is retried after a longer wait (``attempts`` in all,
    each one flush and one request)."""
    if tokens < 2:
        raise LoadProbeError(f"a probe needs at least 2 tokens, got {tokens}")
    rng = random.Random()  # a fresh prompt each start: never another worker's probe pages
    ids = [_TOKEN_BASE + rng.randrange(_TOKEN_SPAN) for _ in range(tokens)]
    warmup = [_TOKEN_BASE + rng.randrange(_TOKEN_SPAN) for _ in range(_WARMUP_TOKENS)]
    own = client is None
    http = client or httpx.Client(timeout=timeout_s)
    try:
        _generate(http, url, warmup)
        cold_s, _ = _generate(http, url, ids)
        best: LoadSample | None = None
        refused = ""
        for attempt in range(attempts):
            time.sleep(settle_s * (attempt + 1))
            resp = http.post(url + "/flush_cache")
            if resp.status_code != 200:  # SGLang refuses while its cache is still writing back
                refused = f"/flush_cache answered {resp.status_code}: {resp.text[:200]}"
                continue
            loaded_s, storage = _generate(http, url, ids)
            best = LoadSample(tokens, cold_s, loaded_s, storage)
            if storage * 2 >= tokens:  # most of it came from the pool: a load was timed
                break
        if best is None:
            raise LoadProbeError(refused)
        return load_rate_Bps(best, kv_bytes_per_token), best
    except httpx.HTTPError as exc:
        raise LoadProbeError(f"probe request to {url} failed: {exc!r}") from exc
    finally:
        if own:
            http.close()


def _generate(http: httpx.Client, url: str, ids: list[int]) -> tuple[float, int]:
    """One greedy one-token request: seconds, storage tokens the engine reported."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    start = time.perf_counter()
    resp = http.post(url + "/generate", json=body)
    elapsed = time.perf_counter() - start
    if resp.status_code != 200:
        raise LoadProbeError(f"/generate answered {resp.status_code}: {resp.text[:200]}")
    try:
        answer: Any = resp.json()
    except ValueError as exc:
        raise LoadProbeError(f"/generate answered no JSON: {resp.text[:200]}") from exc
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    details = meta.get("cached_tokens_details") if isinstance(meta, dict) else None
    storage = details.get("storage") if isinstance(details, dict) else None
    return elapsed, storage if isinstance(storage, int) and not isinstance(storage, bool) else 0
