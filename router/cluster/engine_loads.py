"""The engine-reported source of the load view (docs/interfaces.md, "Several routers, one view",
"The load view"): what each engine says its own load is, read every ``poll_s``, so traffic no
router routed is seen.

- SGLang (0.5.23): ``GET /v1/loads?include=core`` -> ``{"timestamp", "version", "accelerator",
  "num_accelerators", "loads": [one object per dp rank]}``; per rank ``dp_rank``,
  ``num_running_reqs``, ``num_waiting_reqs``, ``num_waiting_uncached_tokens`` (prompt tokens
  queued for prefill, less their cached prefix), ``num_total_tokens`` (KV in use plus queued
  prompts) and ``max_total_num_tokens`` (``sglang/srt/managers/load_snapshot.py``).
- vLLM (and engine ``other``): ``GET /metrics``, the gauges ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (0..1) and the capacity in the
  labels of ``vllm:cache_config_info`` (``kv_cache_size_tokens``), one sample per ``engine``
  label; the worker is one slot (dp rank 0). It reports no queued tokens.

The parsers are pure and raise :class:`EngineLoadError` on anything malformed or absurd.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, NamedTuple

import httpx
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from radix_global.options import opt
from radix_global.types import WorkerId
from router.routing.contract import Slot

log = logging.getLogger("radix_global.router.cluster.engine_loads")

MAX_BODY_BYTES = 8 << 20  # a /metrics of many engines and LoRA labels stays far below
MAX_REQUESTS = 10_000_000
MAX_TOKENS = 1 << 40
MAX_DP_RANKS = 1024
SGLANG_PATH = "/v1/loads?include=core"
VLLM_PATH = "/metrics"
_RUNNING, _WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
_USAGE, _CACHE_INFO = "vllm:kv_cache_usage_perc", "vllm:cache_config_info"
_VLLM_NAMES = frozenset((_RUNNING, _WAITING, _USAGE, _CACHE_INFO))


class EngineLoadError(ValueError):
    """An engine's load report that cannot be used (not JSON/text, wrong types, absurd values)."""


class EngineLoad(NamedTuple):
    """One slot's load as its engine reported it; ``at``: the poller's clock when read."""

    running: int
    waiting: int
    waiting_tokens: int | None  # prompt tokens queued, not yet prefilled (None: not reported)
    kv_headroom_tokens: int | None  # free KV capacity in tokens (None: unknown)
    at: float = 0.0


class EngineTarget(NamedTuple):
    worker_id: str
    url: str
    engine: str  # "sglang": /v1/loads; anything else: vLLM's /metrics
    dp_size: int = 1


def _whole(raw: object, what: str, limit: int) -> int:
    if raw is None:
        raise EngineLoadError(f"{what}: missing")
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise EngineLoadError(f"{what}: not a number ({raw!r:.40})")
    if not math.isfinite(raw) or raw != int(raw):
        raise EngineLoadError(f"{what}: not a whole number ({raw!r:.40})")
    if not 0 <= raw <= limit:
        raise EngineLoadError(f"{what}: {raw!r:.40} outside [0, {limit}]")
    return int(raw)


def _optional(item: Mapping[str, Any], key: str) -> int | None:
    return _whole(item[key], f"/v1/loads {key}", MAX_TOKENS) if key in item else None


def _text(payload: bytes | str, what: str) -> str:
    if len(payload) > MAX_BODY_BYTES:
        raise EngineLoadError(f"{what}: {len(payload)} bytes, over {MAX_BODY_BYTES}")
    if isinstance(payload, str):
        return payload
    try:
        return payload.decode()
    except UnicodeDecodeError as exc:
        raise EngineLoadError(f"{what}: not UTF-8 ({exc})") from None


def parse_sglang_loads(payload: bytes | str | Mapping[str, Any],
                       at: float = 0.0) -> dict[int, EngineLoad]:
    """SGLang's ``/v1/loads`` answer (body or decoded JSON) -> dp rank -> its load. A rank's
    ``at`` is ``at`` less its snapshot's age (the answer's time less the rank's ``timestamp``,
    both the engine's clock): the scheduler writes a snapshot every few iterations and none
    while idle, so an idle engine keeps serving the one taken in its last busy moment."""
    doc: object = payload
    if isinstance(payload, bytes | str):
        try:
            doc = json.loads(_text(payload, "/v1/loads"))
        except (ValueError, RecursionError) as exc:
            raise EngineLoadError(f"/v1/loads: not JSON ({str(exc)[:80]})") from None
    loads = doc.get("loads") if isinstance(doc, Mapping) else None
    if not isinstance(loads, list) or not 0 < len(loads) <= MAX_DP_RANKS:
        raise EngineLoadError(f"/v1/loads: no 'loads' list of 1 to {MAX_DP_RANKS} ranks")
    answered = _epoch(doc.get("timestamp")) if isinstance(doc, Mapping) else None
    out: dict[int, EngineLoad] = {}
    for item in loads:
        if not isinstance(item, Mapping):
            raise EngineLoadError(f"/v1/loads: a rank is not an object ({item!r:.40})")
        taken = item.get("timestamp")
        age = (max(0.0, answered - taken) if answered is not None
               and isinstance(taken, int | float) and not isinstance(taken, bool)
               and math.isfinite(taken) else 0.0)
        rank = _whole(item.get("dp_rank"), "/v1/loads dp_rank", MAX_DP_RANKS - 1)
        if rank in out:
            raise EngineLoadError(f"/v1/loads: dp_rank {rank} twice")
        capacity = _optional(item, "max_total_num_tokens")
        in_use = _optional(item, "num_total_tokens")
        if in_use is None:  # the KV in use alone, without the queued prompts
            in_use = _optional(item, "num_used_tokens")
        headroom = max(0, capacity - in_use) if capacity and in_use is not None else None
        running = _whole(item.get("num_running_reqs"), "/v1/loads num_running_reqs", MAX_REQUESTS)
        waiting = _whole(item.get("num_waiting_reqs"), "/v1/loads num_waiting_reqs", MAX_REQUESTS)
        out[rank] = EngineLoad(running, waiting,
                               _optional(item, "num_waiting_uncached_tokens"),
                               headroom, at - age)
    return out


def _epoch(value: object) -> float | None:
    """An ISO 8601 time (``/v1/loads``'s ``timestamp``) as seconds since the epoch."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _label_tokens(labels: Mapping[str, str], key: str) -> int | None:
    try:
        value = int(labels.get(key, ""))
    except ValueError:  # absent, "None" before the KV cache is sized, or garbage
        return None
    return value if 0 < value <= MAX_TOKENS else None


def parse_vllm_metrics(payload: bytes | str, at: float = 0.0) -> EngineLoad:
    """vLLM's ``/metrics`` text -> the server's load (summed over its ``engine`` labels; the KV
    headroom is the most any one engine has free, as a request lands on one)."""
    text = _text(payload, "/metrics")
    wanted = [ln for ln in text.splitlines()
              if ln.split("{", 1)[0].split(" ", 1)[0] in _VLLM_NAMES]
    try:
        samples = [s for fam in text_string_to_metric_families("\n".join(wanted) + "\n")
                   for s in fam.samples]
    except Exception as exc:  # the parser raises what it likes on garbage
        raise EngineLoadError(f"/metrics: unparsable ({str(exc)[:80]})") from None
    engines: dict[str, dict[str, float]] = {}
    capacity: dict[str, int | None] = {}
    for s in samples:
        engine = s.labels.get("engine", "")
        if s.name == _CACHE_INFO:
            capacity[engine] = _label_tokens(s.labels, "kv_cache_size_tokens") or (
                (_label_tokens(s.labels, "num_gpu_blocks") or 0)
                * (_label_tokens(s.labels, "block_size") or 0) or None)
        elif s.name in _VLLM_NAMES:
            engines.setdefault(engine, {})[s.name] = s.value
    running = waiting = 0
    headroom: int | None = None
    for engine, values in engines.items():
        if _RUNNING not in values or _WAITING not in values:
            raise EngineLoadError(f"/metrics: engine {engine!r} without {_RUNNING}/{_WAITING}")
        running += _whole(values[_RUNNING], _RUNNING, MAX_REQUESTS)
        waiting += _whole(values[_WAITING], _WAITING, MAX_REQUESTS)
        usage, cap = values.get(_USAGE), capacity.get(engine)
        if usage is None or cap is None:
            continue
        if not 0.0 <= usage <= 1.0 + 1e-6:
            raise EngineLoadError(f"/metrics: {_USAGE} {usage!r:.40} outside [0, 1]")
        free = int(cap * (1.0 - min(usage, 1.0)))
        headroom = free if headroom is None else max(headroom, free)
    if not engines:
        raise EngineLoadError(f"/metrics: no {_RUNNING} (not a vLLM server?)")
    if running > MAX_REQUESTS or waiting > MAX_REQUESTS:
        raise EngineLoadError("/metrics: request counts out of range")
    return EngineLoad(running, waiting, None, headroom, at)


@dataclass(frozen=True)
class EngineLoadConfig:
    """The engines' own load reports (router/cluster/engine_loads.py)."""

    # Off by default: SGLang 0.5.23 writes its load snapshot every 15 scheduler iterations and
    # none while idle, so a report can describe a queue that drained a moment ago (seen: a
    # conversation's next turn sent away from its history by a snapshot of the last turn's
    # prefill). On for clusters with traffic that bypasses every router.
    poll_s: Annotated[float, opt(
        "seconds between reads of each engine's own load (/v1/loads, vLLM /metrics); 0: off",
        ge=0)] = 0.0
    timeout_s: Annotated[float, opt("a load read's timeout", gt=0)] = 0.5
    max_concurrency: Annotated[int, opt("load reads in flight at once", ge=1)] = 32
    stale_polls: Annotated[int, opt(
        "an engine's reading older than this many poll periods is not used", ge=1)] = 3


class _BadStatus(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"HTTP {code}")
        self.code = code


class EngineLoadPoller:
    """Reads every listed worker's load every ``poll_s``; :meth:`load` is the last fresh one."""

    def __init__(self, client: httpx.AsyncClient, config: EngineLoadConfig,
                 targets: Callable[[], Iterable[tuple[str, str, str, int]]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.config = config
        self.targets = targets  # -> (worker id, base url, engine kind, dp size) each
        self.clock = clock
        self.failures: dict[str, int] = {}  # kind -> count: timeout|connect|status|parse|error
        self._loads: dict[Slot, EngineLoad] = {}
        self._streak: dict[str, str] = {}  # worker -> kind of its running failure streak
        self._unsupported: set[EngineTarget] = set()  # engine "other" with no vLLM metrics
        self._metric: Counter | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def stale_after_s(self) -> float:
        return self.config.stale_polls * self.config.poll_s

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        self._metric = Counter(
            "radix_global_engine_load_failures", "Failed reads of an engine's own load report "
            "(timeout, connect, status, parse, error)", ["worker", "kind"], registry=registry)

    def slots(self) -> Collection[Slot]:
        """The slots with a reading, stale ones included (a view: read it, do not keep it)."""
        return self._loads.keys()

    def load(self, slot: Slot, now: float | None = None) -> EngineLoad | None:
        """The slot's last reading, or None when there is none or it is stale."""
        got = self._loads.get(slot)
        if got is None:
            return None
        now = self.clock() if now is None else now
        return got if now - got.at <= self.stale_after_s else None

    async def poll_once(self) -> None:
        """One read of every listed worker (those no longer listed are forgotten)."""
        listed = {t.worker_id: t for t in (EngineTarget(*t) for t in self.targets())}
        for slot in [s for s in self._loads
                     if s[0] not in listed or s[1] >= listed[s[0]].dp_size]:
            del self._loads[slot]
        for wid in [w for w in self._streak if w not in listed]:
            del self._streak[wid]
        self._unsupported &= set(listed.values())
        gate = asyncio.Semaphore(self.config.max_concurrency)

        async def one(target: EngineTarget) -> None:
            async with gate:
                await self._read(target)

        await asyncio.gather(*(one(t) for t in listed.values() if t not in self._unsupported))

    async def _get(self, url: str) -> bytes:
        async with self.client.stream("GET", url, timeout=self.config.timeout_s) as resp:
            if resp.status_code != 200:
                raise _BadStatus(resp.status_code)
            body = bytearray()
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise EngineLoadError(f"answer over {MAX_BODY_BYTES} bytes")
            return bytes(body)

    async def _read(self, t: EngineTarget) -> None:
        sglang = t.engine == "sglang"
        try:
            url = t.url.rstrip("/") + (SGLANG_PATH if sglang else VLLM_PATH)
            # a whole-read deadline: httpx's timeout is per operation (a drip-feeding body)
            body = await asyncio.wait_for(self._get(url), self.config.timeout_s)
            now = self.clock()
            ranks = parse_sglang_loads(body, now) if sglang else {0: parse_vllm_metrics(body, now)}
        except (httpx.TimeoutException, TimeoutError) as exc:
            return self._failed(t, "timeout", exc)
        except httpx.HTTPError as exc:
            return self._failed(t, "connect", exc)
        except (_BadStatus, EngineLoadError) as exc:
            if t.engine == "other" and getattr(exc, "code", 404) == 404:
                self._unsupported.add(t)  # an OpenAI server that is not vLLM: no load source
            return self._failed(t, "status" if isinstance(exc, _BadStatus) else "parse", exc)
        except Exception as exc:  # a bug must not stop the other reads
            return self._failed(t, "error", exc)
        for rank, reading in ranks.items():
            if rank < t.dp_size:
                self._loads[(WorkerId(t.worker_id), rank)] = reading
        if self._streak.pop(t.worker_id, None) is not None:
            log.info("engine load of worker %s readable again", t.worker_id)

    def _failed(self, t: EngineTarget, kind: str, exc: BaseException) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1
        if self._metric is not None:
            self._metric.labels(t.worker_id, kind).inc()
        if t.worker_id not in self._streak:  # once per streak, not every poll
            log.warning("engine load of worker %s (%s) unreadable, %s: %s%s", t.worker_id,
                        t.url, kind, str(exc)[:200] or type(exc).__name__,
                        "; not read again" if t in self._unsupported else "")
        self._streak[t.worker_id] = kind

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.poll_once()
            except Exception:  # a bug in one round must not stop the reads
                log.exception("engine load round failed")
            await asyncio.sleep(max(0.0, self.config.poll_s - (loop.time() - started)))

    def start(self) -> None:
        if self._task is None and self.config.poll_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
