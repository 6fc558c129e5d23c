"""Prefill/decode disaggregation: the pure part (request bodies, configuration, pool utilisation).

Two ways to hand a prefill's KV to a decode worker (``PdMode``):

- ``native``: SGLang's own PD (``--disaggregation-mode prefill|decode`` with a transfer backend).
  The router sends the *same* request to the prefill and the decode worker at once, carrying
  SGLang's bootstrap fields (``bootstrap_host`` = the prefill worker's host, ``bootstrap_port`` =
  its ``--disaggregation-bootstrap-port``, ``bootstrap_room`` = a random 63-bit id shared by
  both), exactly as ``sglang_router`` / ``sglang_router.mini_lb`` do; the decode worker's answer
  is the client's answer. On CPU this does not work with SGLang 0.5.23 (``docs/pd.md``).
- ``pool``: hand-off through the L3 pool. Both workers are ordinary SGLang servers whose HiCache
  writes pages through to the shared pool. The router sends the prompt to the prefill worker with
  ``max_new_tokens = 1`` (it computes what is not cached anywhere and writes the pages through),
  waits until the prompt's pages are in the pool, then sends the original request to the decode
  worker, which prefetches the prompt from the pool instead of computing it, and decodes.

``PdUtilization`` keeps per-role busy time so that an operator can tune the prefill:decode ratio
(``PdConfig.prefill_share``). Nothing here does I/O.
"""

from __future__ import annotations

import random
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, NamedTuple

from radix_global.options import opt
from radix_global.types import Role, WorkerId
from router.keying.request_body import RequestKind

PREFILL_RID_SUFFIX = "-prefill"
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


class PdMode(StrEnum):
    NATIVE = "native"
    POOL = "pool"


class PdError(ValueError):
    """A request or configuration the PD path cannot take (bad body, bad ratio)."""


@dataclass(frozen=True)
class PdConfig:
    """Prefill/decode disaggregation (docs/pd.md).

    Used when a model has prefill- and decode-role workers.

    ``ratio`` ``"P:D"`` (``prefill_workers:decode_workers``) is the intended pool ratio (what the
    operator deploys; the utilisation report says whether it fits the load).
    ``pool_ready_timeout_s``: how long the hand-off waits for the prefill's pages to reach the
    pool before sending the decode request anyway (a late page is recomputed by the decode
    worker, never wrong). ``decode_attempts``: decode workers tried per request when one fails
    before answering. The live router's is ``RouterConfig.pd`` (options ``pd_*``), whose
    defaults are these.
    """

    mode: Annotated[PdMode, opt(
        "prefill/decode hand-off: native (SGLang's) or pool (through the L3 pool)")
    ] = PdMode.NATIVE
    ratio: Annotated[str, opt(
        "deployed prefill:decode ratio P:D, for the utilisation report", metavar="P:D")] = "1:1"
    pool_ready_timeout_s: Annotated[float, opt(
        "pool hand-off: wait this long for the prefill's pages", ge=0)] = 10.0
    pool_ready_poll_s: Annotated[float, opt(
        "pool hand-off: poll the index this often", gt=0)] = 0.02
    decode_attempts: Annotated[int, opt(
        "decode workers tried per request when one fails", ge=1)] = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", PdMode(self.mode))
        if self.prefill_workers < 1 or self.decode_workers < 1:
            raise PdError("prefill:decode ratio needs at least one worker of each role")
        if self.pool_ready_timeout_s < 0 or self.pool_ready_poll_s <= 0:
            raise PdError("pool_ready_timeout_s must be >= 0 and pool_ready_poll_s > 0")
        if self.decode_attempts < 1:
            raise PdError("decode_attempts must be >= 1")

    @property
    def prefill_workers(self) -> int:
        return _ratio(self.ratio)[0]

    @property
    def decode_workers(self) -> int:
        return _ratio(self.ratio)[1]

    @property
    def prefill_share(self) -> float:
        return self.prefill_workers / (self.prefill_workers + self.decode_workers)

    @classmethod
    def parse_ratio(cls, text: str, **kw: Any) -> PdConfig:
        """``"P:D"`` (e.g. ``"1:2"``) -> a config with that ratio."""
        return cls(ratio=text, **kw)


def _ratio(text: str) -> tuple[int, int]:
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError as exc:
        raise PdError(f"pd_ratio must look like 'P:D' with integers, got {text!r}") from exc
    return p, d


def new_bootstrap_room(rng: random.Random | None = None) -> int:
    """A room id as SGLang's router draws it: uniform in [0, 2**63 - 1]."""
    return (rng or random).randint(0, 2**63 - 1)


def bootstrap_host_of(prefill_url: str) -> str:
    """The host part of a worker URL (IPv6 bracketed, as SGLang's router does)."""
    host = urllib.parse.urlparse(prefill_url).hostname
    if not host:
        raise PdError(f"no host in worker URL {prefill_url!r}")
    return f"[{host}]" if ":" in host else host


def native_body(payload: Mapping[str, Any], batch: int | None, prefill_url: str,
                bootstrap_port: int, room: int) -> dict[str, Any]:
    """The body both workers get in native PD: the client's request plus the bootstrap fields.
    A batch request (``batch`` prompts) gets one room per item, as SGLang's router does."""
    if bootstrap_port <= 0:
        raise PdError(f"prefill worker has no bootstrap port ({bootstrap_port})")
    body = dict(payload)
    host = bootstrap_host_of(prefill_url)
    if batch is None:
        body.update(bootstrap_host=host, bootstrap_port=bootstrap_port, bootstrap_room=room)
    else:
        rng = random.Random(room)
        body.update(bootstrap_host=[host] * batch, bootstrap_port=[bootstrap_port] * batch,
                    bootstrap_room=[room] + [new_bootstrap_room(rng) for _ in range(batch - 1)])
    return body


def prefill_only_body(payload: Mapping[str, Any], kind: RequestKind, request_id: str
                      ) -> dict[str, Any]:
    """The prefill step of a pool hand-off: same prompt, one output token, not streamed.

    One token (not zero) because SGLang has no prefill-only generate; that token is discarded.
    The rid gets a suffix so the prefill and decode halves are distinct engine requests."""
    body = dict(payload)  # top-level fields only change (sampling_params is copied below)
    body["stream"] = False
    body.pop("stream_options", None)
    if kind == RequestKind.GENERATE:
        params = body.get("sampling_params")
        if params is not None and not isinstance(params, dict):
            raise PdError("sampling_params must be an object")
        params = dict(params or {})
        params["max_new_tokens"] = 1
        params.pop("min_new_tokens", None)
        body["sampling_params"] = params
        body["rid"] = request_id + PREFILL_RID_SUFFIX
    elif kind in (RequestKind.COMPLETION, RequestKind.CHAT):
        body["max_tokens"] = 1
        body.pop("max_completion_tokens", None)
        body.pop("min_tokens", None)
        body["rid"] = request_id + PREFILL_RID_SUFFIX
    else:
        raise PdError(f"unknown request kind {kind!r}")
    body.pop("n", None)
    return body


def decode_step_body(payload: Mapping[str, Any], request_id: str) -> dict[str, Any]:
    """The decode step of a pool hand-off: the client's request under its own rid."""
    body = dict(payload)
    body["rid"] = request_id
    return body


def cached_tokens_of(answer: Any) -> tuple[int | None, int | None, int | None]:
    """``(prompt_tokens, cached_tokens, storage_tokens)`` from an SGLang ``/generate`` answer or
    an OpenAI answer's ``usage`` (None where the engine did not say)."""
    if not isinstance(answer, dict):
        return None, None, None
    meta = answer.get("meta_info")
    if isinstance(meta, dict):
        details = meta.get("cached_tokens_details") or {}
        storage = details.get("storage") if isinstance(details, dict) else None
        return (_int(meta.get("prompt_tokens")), _int(meta.get("cached_tokens")),
                _int(storage))
    usage = answer.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return _int(usage.get("prompt_tokens")), _int(cached), None
    return None, None, None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RoleUtilization(NamedTuple):
    role: Role
    workers: int
    busy_s: float
    utilization: float  # busy_s / (workers * window_s), in [0, 1] unless overlapping work


class PdReport(NamedTuple):
    window_s: float
    prefill: RoleUtilization
    decode: RoleUtilization
    configured_ratio: str  # "P:D" from PdConfig
    suggested_ratio: str  # the ratio that would equalise utilisation for the same total
    rejected_before_prefill: int
    decode_retries: int

    def to_json(self, mode: PdMode) -> dict[str, Any]:
        """The report as ``/admin/stats`` (key ``pd``) and ``radix-global status`` show it."""
        return {"mode": mode.value, "window_s": self.window_s,
                "configured_ratio": self.configured_ratio, "suggested_ratio": self.suggested_ratio,
                **{r.role.value: {"workers": r.workers, "busy_s": round(r.busy_s, 3),
                                  "utilization": round(r.utilization, 4)}
                   for r in (self.prefill, self.decode)},
                "rejected_before_prefill": self.rejected_before_prefill,
                "decode_retries": self.decode_retries}


class PdUtilization:
    """Busy time per worker and role, over a sliding window, for the ratio report.

    A worker is busy while it has at least one request of this router in its phase (a prefill
    step on a prefill worker, a decode stream on a decode worker); overlapping requests on one
    worker count once (the union of intervals), so utilisation never exceeds 1 per worker.
    """

    def __init__(self, config: PdConfig, window_s: float = 60.0) -> None:
        if window_s <= 0:
            raise PdError("window_s must be > 0")
        self.config, self.window_s = config, window_s
        self._roles: dict[WorkerId, Role] = {}
        self._open: dict[WorkerId, tuple[int, float]] = {}  # worker -> (active count, since)
        self._spans: dict[WorkerId, list[tuple[float, float]]] = {}
        self.rejected_before_prefill = 0
        self.decode_retries = 0

    @property
    def seen(self) -> bool:
        """Whether any PD request (or refusal) was tracked: before that there is no report."""
        return bool(self._roles) or self.rejected_before_prefill > 0

    def begin(self, worker: WorkerId, role: Role, now: float) -> None:
        self._roles[worker] = role
        count, since = self._open.get(worker, (0, now))
        self._open[worker] = (count + 1, since if count else now)

    def end(self, worker: WorkerId, now: float) -> None:
        count, since = self._open.get(worker, (0, now))
        if count <= 0:
            return
        if count == 1:
            del self._open[worker]
            self._spans.setdefault(worker, []).append((since, now))
        else:
            self._open[worker] = (count - 1, since)

    def known_workers(self, workers: Iterable[tuple[WorkerId, Role]]) -> None:
        """Declare workers (idle ones count in the denominator)."""
        for wid, role in workers:
            self._roles.setdefault(wid, role)

    def report(self, now: float) -> PdReport:
        start = now - self.window_s
        busy: dict[Role, float] = {Role.PREFILL: 0.0, Role.DECODE: 0.0}
        count: dict[Role, int] = {Role.PREFILL: 0, Role.DECODE: 0}
        for wid, role in self._roles.items():
            if role not in busy:
                continue
            count[role] += 1
            spans = [s for s in self._spans.get(wid, []) if s[1] > start]
            self._spans[wid] = spans
            if wid in self._open:
                spans = [*spans, (self._open[wid][1], now)]
            busy[role] += sum(min(b, now) - max(a, start) for a, b in spans if b > a)
        util = {r: busy[r] / (count[r] * self.window_s) if count[r] else 0.0 for r in busy}
        total = self.config.prefill_workers + self.config.decode_workers
        return PdReport(
            self.window_s,
            RoleUtilization(Role.PREFILL, count[Role.PREFILL], busy[Role.PREFILL],
                            util[Role.PREFILL]),
            RoleUtilization(Role.DECODE, count[Role.DECODE], busy[Role.DECODE],
                            util[Role.DECODE]),
            f"{self.config.prefill_workers}:{self.config.decode_workers}",
            suggest_ratio(busy[Role.PREFILL], busy[Role.DECODE], total),
            self.rejected_before_prefill, self.decode_retries)


def suggest_ratio(prefill_busy_s: float, decode_busy_s: float, total_workers: int) -> str:
    """Split ``total_workers`` in proportion to the busy time of each phase (at least one each)."""
    if total_workers < 2:
        raise PdError("a PD cluster needs at least two workers")
    work = prefill_busy_s + decode_busy_s
    if work <= 0:
        return f"{total_workers // 2}:{total_workers - total_workers // 2}"
    p = round(total_workers * prefill_busy_s / work)
    p = min(total_workers - 1, max(1, p))
    return f"{p}:{total_workers - p}"
