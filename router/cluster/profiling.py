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

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, NamedTuple, Protocol

import httpx
import numpy as np

from radix_global.options import opt
from radix_global.types import WorkerId
from router.cluster.profile_book import ProfileBook
from router.cluster.profile_store import ProfileStore
from router.cluster.registry import WorkerEntry, WorkerRegistry
from router.routing.cost import CostModel
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


@dataclass(frozen=True)
class ProfilingConfig:
    """Prefill-model bootstrap (router/cluster/profiling.py).

    Timed 1-token generations when a worker joins (at most the engine's KV capacity); fitted
    profiles kept across restarts (router/cluster/profile_store.py)."""

    max_tokens: Annotated[int, opt(
        "prefill profiling on worker join up to this many tokens; 0 = off", ge=0)] = 2048
    sizes: Annotated[int, opt("input lengths profiled (halving)", ge=1)] = 3
    file: Annotated[str | None, opt(
        "save fitted profiles here; a returning worker is priced with its saved one",
        name="profiles_file")] = None


class ProfileState(StrEnum):
    """Where a worker's prefill profile came from (``/admin/stats`` ``profiles``)."""

    RUNNING = "running"  # being measured; priced with its peers' curve meanwhile
    DONE = "done"  # measured here
    RESTORED = "restored"  # fitted before: the profiles file, or the service
    SHARED = "shared"  # measured by the leader router, read from the service
    FAILED = "failed"  # could not be measured: the inherited curve learns online


class ProfileShare(Protocol):
    """What the other routers contribute (``router.coordination.view.LoadView``; a router alone
    leads and shares nothing)."""

    def leads(self) -> bool:
        """Whether this router measures joining workers (the leader does, once per cluster)."""
        ...

    def fitted_elsewhere(self, worker_id: str, namespace: str) -> tuple[float, ...] | None:
        """A profile another router fitted, as read from the service (None: none known)."""
        ...

    def fitted_here(self, worker_id: str, namespace: str, coef: tuple[float, ...]) -> None:
        """Share a profile this router fitted."""
        ...


class Profiler:
    """A worker's prefill profile from its join to its departure: a returning worker is priced
    with its saved (or shared) profile; a new one with its profiled peers' mean curve while the
    leader measures it in the background; a fitted profile is installed into the cost model,
    saved and shared. ``outcomes``: per worker id, its :class:`ProfileState` and coefficients."""

    def __init__(self, config: ProfilingConfig, cost: CostModel, registry: WorkerRegistry,
                 client: httpx.AsyncClient, share: ProfileShare, page_size: int | None,
                 timeout_s: float) -> None:
        self.config, self.cost, self.registry, self.client = config, cost, registry, client
        self.share, self.page_size, self.timeout_s = share, page_size, timeout_s
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.book = ProfileBook()
        self.saved = ProfileStore(config.file) if config.file else None
        self._tasks: set[asyncio.Task[None]] = set()

    def joined(self, entry: WorkerEntry) -> None:
        """Price a joining worker, and measure it when no profile of it is known."""
        if not self.restore(entry):
            self.inherit(entry)
            if self.share.leads():  # else the leader's profile comes through the service
                self.start(entry)

    def left(self, worker_id: str) -> None:
        """Forgotten: its profile (a measurement still running ends unused, never pending)."""
        self.book.left(worker_id)
        self.outcomes.pop(worker_id, None)

    def shared(self, entry: WorkerEntry, coef: tuple[float, ...]) -> None:
        """A profile another router fitted (the leader profiles joining workers)."""
        state = self.outcomes.get(entry.info.worker_id, {}).get("state")
        if state in (ProfileState.DONE, ProfileState.RESTORED):
            return
        self.book.joined(entry.info.worker_id, entry.info.namespace)
        self.apply(entry, PrefillModel(prior=coef))
        self._outcome(entry, ProfileState.SHARED, coef=list(coef))

    def restore(self, entry: WorkerEntry) -> bool:
        """Price a returning worker with the profile fitted before this router restarted."""
        info = entry.info
        coef = self.saved.get(info.worker_id, info.namespace) if self.saved is not None else None
        if coef is None:  # fitted by the leader, read from the service
            coef = self.share.fitted_elsewhere(info.worker_id, info.namespace)
        if coef is None:
            return False
        self.book.joined(info.worker_id, info.namespace)
        self.apply(entry, PrefillModel(prior=coef))
        self._outcome(entry, ProfileState.RESTORED, coef=list(coef))
        log.info("worker %s priced with its saved prefill profile %s", info.worker_id, coef)
        return True

    def inherit(self, entry: WorkerEntry) -> None:
        """Price a joining worker like its profiled peers of the same namespace until its own
        profile is fitted (``ProfileBook``); with none, the default prior stays."""
        model = self.book.joined(entry.info.worker_id, entry.info.namespace)
        if model is not None:
            self.cost.set_prefill_model(entry.worker_id, model)
            log.info("worker %s priced with its peers' prefill profile until its own is fitted",
                     entry.info.worker_id)

    def apply(self, entry: WorkerEntry, model: PrefillModel) -> None:
        """Install ``entry``'s own fitted profile; peers still without one inherit it."""
        # learn_from_inferred_prefill is the cost model's (CostConfig, from the router's config)
        self.cost.set_prefill_model(entry.worker_id, model)
        for wid, inherited in self.book.fitted(entry.info.worker_id, model).items():
            self.cost.set_prefill_model(WorkerId(wid), inherited)

    def start(self, entry: WorkerEntry) -> None:
        """Measure the joining worker's prefill curve in the background; until it is done the
        worker is priced with its peers' profile (or the default prior)."""
        if self.config.max_tokens <= 0:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # registered outside the server loop (tests): nothing to run on
            return
        self._outcome(entry, ProfileState.RUNNING)
        task = loop.create_task(self._measure(entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def pending(self) -> int:
        return sum(1 for p in self.outcomes.values() if p["state"] is ProfileState.RUNNING)

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _measure(self, entry: WorkerEntry) -> None:
        wid = entry.info.worker_id
        try:
            samples = await profile_worker(
                self.client, entry.info.url, self.page_size or entry.info.page_size,
                self.config.max_tokens, self.config.sizes, timeout_s=self.timeout_s,
                model=None if entry.info.engine == "sglang" else entry.info.model)
            model = fit_profile(samples)
        except Exception as exc:  # a worker that cannot be profiled keeps the prior
            log.warning("profiling worker %s failed: %r", wid, exc)
            self._outcome(entry, ProfileState.FAILED, error=repr(exc))
            if self.registry.find(wid) is not None:  # an inherited model learns online then
                self.cost.set_prefill_model(entry.worker_id,
                                            self.cost.prefill_model(entry.worker_id),
                                            learn_inferred=True)
            return
        if self.registry.find(wid) is None:
            return  # left while being profiled
        self.apply(entry, model)
        self._outcome(entry, ProfileState.DONE, coef=list(model.coef),
                      samples=[list(s) for s in samples])
        if self.saved is not None:
            self.saved.put(wid, entry.info.namespace, model.coef)
        self.share.fitted_here(wid, entry.info.namespace, model.coef)
        log.info("worker %s profiled: prefill coef %s", wid, model.coef)

    def _outcome(self, entry: WorkerEntry, state: ProfileState, **detail: Any) -> None:
        self.outcomes[entry.info.worker_id] = {"state": state, **detail}
