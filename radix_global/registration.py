"""The worker registration record: what a worker tells the index and the router when it joins.

Schema and rules: ``docs/interfaces.md`` (section "Worker registration"). Decoding validates types
and values, so a bad record is refused with a :class:`RegistrationError` naming the field.
"""

from __future__ import annotations

import math
import re

import msgspec

from radix_global.endpoints import endpoint_problem, is_host_local
from radix_global.types import Role


class RegistrationError(ValueError):
    """A registration record that cannot be accepted (bad field, conflicting id, bad namespace)."""


# Bounds on what a registration may ask of the router and the index: each dp rank is a routing
# slot (and a subscriber socket), each page size a tree; no real engine is near them.
MAX_DP_SIZE = 1024
MAX_PAGE_SIZE = 65536
MAX_FETCH_MIN_TOKENS = 1 << 20
MAX_PREFETCH_BUDGET_TOKENS = 1 << 40
# The longest context a worker may report (its /server_info ``context_length``, vLLM's
# ``max_model_len``): 2^24 = 16,777,216 tokens, above the longest served today (Llama 4 Scout's
# 10M), while a value such as 1e12 would turn the router's prompt-size checks off for the model.
MAX_CONTEXT_LENGTH = 1 << 24
MAX_ID_CHARS = 256
MAX_URL_CHARS = 2048
_TEXT_FIELDS = ("worker_id", "model", "namespace", "kv_events_topic", "pool_id",
                "compute_domain", "pool_disk_id", "place")
# a worker's place: fault domains widest first (docs/interfaces.md, "Where hosts are")
MAX_PLACE_LEVELS = 4
_PLACE_LABEL = re.compile(r"[A-Za-z0-9._-]{1,63}")
_URL_FIELDS = ("url", "kv_events_endpoint", "kv_events_replay_endpoint", "pool_events_endpoint")


def _check_text(info: WorkerInfo) -> None:
    """Identifiers end up in HTTP headers, metric labels and log lines: printable, bounded."""
    for name, limit in [(f, MAX_ID_CHARS) for f in _TEXT_FIELDS] + \
            [(f, MAX_URL_CHARS) for f in _URL_FIELDS]:
        value = getattr(info, name)
        if value is not None and (len(value) > limit or not value.isprintable()):
            raise RegistrationError(f"{name} must be at most {limit} printable characters")


class WorkerInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One worker's registration. Immutable; re-registering the same id replaces it."""

    worker_id: str
    url: str  # base URL of the engine's HTTP server, e.g. http://127.0.0.1:30000
    model: str  # served model name as clients send it in "model"
    namespace: str  # "<model>@<version>": selects the index tree; see interfaces.md
    page_size: int  # tokens per KV page (SGLang --page-size; vLLM block size)
    role: Role = Role.MIXED
    dp_size: int = 1  # data-parallel ranks; events carry attn_dp_rank in [0, dp_size)
    engine: str = "sglang"  # "sglang" | "vllm" | "other" (which event decoder and hash rules)
    kv_events_endpoint: str | None = None  # ZMQ PUB endpoint the index subscribes to
    kv_events_replay_endpoint: str | None = None  # ZMQ ROUTER replay endpoint
    kv_events_topic: str = "kv-events"
    pool_id: str | None = None  # the L3 pool this worker reads and writes, if any
    pool_events_endpoint: str | None = None  # ZMQ PUB of this worker's L3 stores/removals
    bootstrap_port: int | None = None  # SGLang PD bootstrap port (prefill workers)
    # Workers with the same compute_domain share their compute (e.g. CPU engines on one host):
    # the router queues their prefills as one server. None: the worker computes on its own.
    compute_domain: str | None = None
    # Bytes one token's KV occupies on the wire (every layer and rank, KV cache dtype): the
    # router prices this namespace's pool fetches with it. None: the router's default.
    kv_bytes_per_token: int | None = None
    # Its pool backend resolves shared-prefix aliases by asking the router it registered with
    # (docs/interfaces.md, "Shared platform prefixes across isolated tenants"); without it the
    # router never predicts a shared-prefix hit.
    pool_aliases: bool = False
    # The holder of its pool's persistent disk tier and the disk's measured read bandwidth
    # (docs/interfaces.md, "The persistent disk tier under the pool"): the router prices a fetch
    # from the disk with it.
    pool_disk_id: str | None = None
    pool_disk_read_Bps: float | None = None
    # The shortest pool run (tokens beyond its own cache) its engine loads at all: SGLang skips
    # a storage prefetch under its ``prefetch_threshold`` (256 by default, at least a page) and
    # recomputes. The router plans no shorter fetch for it (interfaces.md, "Worker registration").
    # 0: any run.
    pool_fetch_min_tokens: int = 0
    # KV bytes per second its engine loads a pool run at, through SGLang's whole load path,
    # measured by the launch wrapper (interfaces.md, "Worker registration"): once it has profiled
    # the worker's prefill, the router prices its fetches at no faster.
    pool_load_Bps: float | None = None
    # Tokens of storage prefetches its engine holds at once before it declines new ones (SGLang:
    # half its host tier, interfaces.md, "Worker registration"): the conductor plans no fetch past
    # it. 0: no limit known.
    pool_prefetch_budget_tokens: int = 0
    # The fault domains its host sits in, widest first ("zone-a/rack-3"): the router builds
    # its topology from them (docs/interfaces.md, "Where hosts are"). None: under the root.
    place: str | None = None
    # The bytes its pool holds (a Mooncake segment: the one its client contributes): the router
    # bounds copies of hot prefixes by a share of its segments' capacity. None: not known.
    pool_capacity_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_text(self)
        if not self.worker_id or "/" in self.worker_id:
            raise RegistrationError("worker_id must be non-empty and contain no '/'")
        if not self.url.startswith(("http://", "https://")):
            raise RegistrationError(f"url must be http(s)://..., got {self.url!r}")
        if "@" not in self.namespace or "/" in self.namespace:  # "/" ends it in pool keys
            raise RegistrationError(
                f"namespace must be '<model>@<version>' without '/', got {self.namespace!r}"
            )
        if not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise RegistrationError(f"page_size must be in [1, {MAX_PAGE_SIZE}], "
                                    f"got {self.page_size}")
        if not 1 <= self.dp_size <= MAX_DP_SIZE:
            raise RegistrationError(f"dp_size must be in [1, {MAX_DP_SIZE}], got {self.dp_size}")
        if self.bootstrap_port is not None and not 0 < self.bootstrap_port < 65536:
            raise RegistrationError(f"bootstrap_port must be a port, got {self.bootstrap_port}")
        if self.engine not in ("sglang", "vllm", "other"):
            raise RegistrationError(f"engine must be sglang|vllm|other, got {self.engine!r}")
        if self.pool_id is not None and self.pool_id == self.worker_id:
            raise RegistrationError("pool_id must differ from worker_id")
        if self.pool_disk_id is not None and (self.pool_id is None or self.pool_disk_id in (
                self.pool_id, self.worker_id)):
            raise RegistrationError("pool_disk_id needs a pool_id and must differ from it and "
                                    "from worker_id")
        for name in ("pool_disk_read_Bps", "pool_load_Bps"):
            rate = getattr(self, name)
            if rate is not None and not (math.isfinite(rate) and rate > 0):
                raise RegistrationError(f"{name} must be a positive number or absent")
        if not 0 <= self.pool_fetch_min_tokens <= MAX_FETCH_MIN_TOKENS:
            raise RegistrationError(f"pool_fetch_min_tokens must be in [0, "
                                    f"{MAX_FETCH_MIN_TOKENS}], got {self.pool_fetch_min_tokens}")
        if not 0 <= self.pool_prefetch_budget_tokens <= MAX_PREFETCH_BUDGET_TOKENS:
            raise RegistrationError(
                f"pool_prefetch_budget_tokens must be in [0, {MAX_PREFETCH_BUDGET_TOKENS}], "
                f"got {self.pool_prefetch_budget_tokens}")
        if self.kv_bytes_per_token is not None and self.kv_bytes_per_token < 1:
            raise RegistrationError(
                f"kv_bytes_per_token must be >= 1 or absent, got {self.kv_bytes_per_token}")
        if self.place is not None:
            check_place(self.place)
        if self.pool_capacity_bytes is not None and self.pool_capacity_bytes < 1:
            raise RegistrationError(
                f"pool_capacity_bytes must be >= 1 or absent, got {self.pool_capacity_bytes}")
        for name, ranks in (("kv_events_endpoint", self.dp_size),
                            ("kv_events_replay_endpoint", self.dp_size),
                            ("pool_events_endpoint", 1)):
            endpoint = getattr(self, name)
            problem = None if endpoint is None else endpoint_problem(endpoint, ranks)
            if problem is not None:  # refused here: "registered" must mean "can be followed"
                raise RegistrationError(f"{name} {endpoint!r}: {problem}")


def refuse_host_local(info: WorkerInfo) -> None:
    """For a registration that came from another host: refuse a URL or endpoint only the
    worker's own host can reach (loopback, wildcard, ipc), which the receiver would try on its
    own host instead (``docs/interfaces.md`` section "Across hosts")."""
    for name in _URL_FIELDS:
        value = getattr(info, name)
        if value is not None and is_host_local(value):
            raise RegistrationError(
                f"{name} {value!r} is reachable only on the worker's own host, and this "
                "registration came from another host: start the worker with "
                "--radix-global-advertise-host <an address of its host that this one can reach>")


def decode_worker_info(data: bytes | str) -> WorkerInfo:
    """Decode a JSON registration record; every failure is a :class:`RegistrationError`."""
    try:
        return msgspec.json.decode(data, type=WorkerInfo)
    except RegistrationError:
        raise
    except msgspec.ValidationError as exc:
        raise RegistrationError(str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise RegistrationError(f"malformed JSON: {exc}") from exc


def encode_worker_info(info: WorkerInfo) -> bytes:
    return msgspec.json.encode(info)


def check_place(place: str) -> list[str]:
    """The domains of a place, widest first; :class:`RegistrationError` for a malformed one."""
    labels = place.split("/")
    if not 1 <= len(labels) <= MAX_PLACE_LEVELS or not all(
            _PLACE_LABEL.fullmatch(label) for label in labels):
        raise RegistrationError(
            f"place must be 1 to {MAX_PLACE_LEVELS} '/'-separated labels of [A-Za-z0-9._-] "
            f"(at most 63 characters each), widest first, e.g. zone-a/rack-3; got {place!r}")
    return labels
