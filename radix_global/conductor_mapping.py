"""Mooncake Conductor's identities onto ours, without I/O (``docs/interfaces.md``,
"Mooncake Conductor's indexer API").

* :func:`instance_spec`, :func:`add_rank`, :meth:`Instance.info`: their ``/register`` record (one
  dp rank of an instance) -> our :class:`~radix_global.registration.WorkerInfo`
  (``worker_id`` = ``instance_id``, namespace ``<modelname>@<additionalsalt or 0>``,
  ``page_size`` = ``block_size``, rank ``r`` at the rank-0 endpoint + ``r``:
  :func:`rank0_endpoint`), plus what only this API keeps: the tenant and the adapters table.
* :func:`check_query`, :func:`answer_query`: their ``/query`` -> our page keys
  (:func:`radix_global.keys.page_keys` with ``cache_salt`` and the LoRA adapter's extra key) per
  candidate worker, matched by a caller-given ``match``, answered per tier and dp rank in
  tokens (:func:`hits`).

Refusals are :class:`~radix_global.conductor_wire.ApiError`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radix_global.conductor_wire import (
    MAX_QUERY_TOKENS,
    ApiError,
    QueryBody,
    RegisterBody,
    require_printable,
)
from radix_global.keys import lora_extra_key, page_keys
from radix_global.namespaces import namespace_for
from radix_global.ops import IndexRefusal, MatchResult
from radix_global.registration import MAX_DP_SIZE, MAX_PAGE_SIZE, WorkerInfo
from radix_global.types import Namespace, PageKey, WorkerId

DEFAULT_TENANT = "default"
# Where an instance registered without a ``url`` "is": a reserved name (RFC 2606) that never
# resolves. The index service never contacts a worker's URL; a router must not route to it.
NO_URL = "http://unknown.invalid"
ENGINES = {"sglang": "sglang", "vllm": "vllm"}  # their ``type``, case-insensitive -> ours

Match = Callable[[Namespace, list[PageKey]], MatchResult]


@dataclass(frozen=True)
class InstanceSpec:
    """What every dp rank of one instance must agree on."""

    tenant: str
    engine: str
    model: str
    block_size: int
    additional_salt: str
    url: str
    topic: str
    lora: tuple[tuple[str, str], ...]  # adapter name -> SGLang extra key, sorted
    endpoint: str  # rank 0's
    replay_endpoint: str | None  # rank 0's


@dataclass
class Instance:
    """An instance registered through the API: its spec and its registered dp ranks."""

    spec: InstanceSpec
    ranks: set[int] = field(default_factory=set)

    def info(self, worker_id: str) -> WorkerInfo:
        """The worker it is to our service (``dp_size`` = highest registered rank + 1)."""
        s = self.spec
        return WorkerInfo(
            worker_id=worker_id, url=s.url, model=s.model,
            namespace=namespace_for(s.model, None, s.additional_salt or None),
            page_size=s.block_size, dp_size=max(self.ranks) + 1, engine=s.engine,
            kv_events_endpoint=s.endpoint, kv_events_replay_endpoint=s.replay_endpoint,
            kv_events_topic=s.topic)


def rank0_endpoint(endpoint: str, rank: int, name: str) -> str:
    """The endpoint of rank 0 given rank ``rank``'s, by the layout SGLang and vLLM bind (rank
    ``r`` at tcp port + ``r``, ipc/inproc name + ``_dp<r>``; ``subscriber.offset_endpoint``)."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        if port.isdigit() and int(port) - rank >= 1:
            return f"{base}:{int(port) - rank}"
        raise ApiError(400, f"{name} {endpoint!r} of dp_rank {rank}: its port - {rank} is no "
                       "port (rank r publishes at rank 0's port + r)", "invalid")
    suffix = f"_dp{rank}"
    if endpoint.startswith(("ipc://", "inproc://")) and endpoint.endswith(suffix):
        return endpoint[: -len(suffix)]
    raise ApiError(400, f"{name} {endpoint!r} of dp_rank {rank} must be rank 0's tcp port + "
                   f"{rank}, or rank 0's ipc/inproc name + {suffix!r}", "invalid")


def instance_spec(reg: RegisterBody) -> InstanceSpec:
    """The instance a ``/register`` record describes; 400 for what cannot be mapped."""
    require_printable(reg, "type", "modelname", "instance_id", "tenant_id", "additionalsalt",
                      "lora_name", "topic")
    engine = ENGINES.get(reg.type.lower())
    if engine is None:
        raise ApiError(400, f"type {reg.type!r}: only SGLang and vLLM publishers (their "
                       "engine events); a Mooncake master's RFC #1527 seq_hashes cannot "
                       "be mapped onto this index's page keys", "unsupported")
    if not 0 <= reg.dp_rank < MAX_DP_SIZE:
        raise ApiError(400, f"dp_rank must be in [0, {MAX_DP_SIZE}), got {reg.dp_rank}",
                       "invalid")
    lora = {name: lora_extra_key(name, path) for name, path in (reg.lora_paths or {}).items()}
    if reg.lora_name and reg.lora_name not in lora:
        raise ApiError(400, f"lora_name {reg.lora_name!r}: an SGLang engine publishes its "
                       "base model's and every adapter's pages on one stream; name the "
                       "engine's adapters in lora_paths {name: path} (its --lora-paths) "
                       "so their pages can be keyed", "unknown_lora")
    return InstanceSpec(
        tenant=reg.tenant_id or DEFAULT_TENANT, engine=engine, model=reg.modelname,
        block_size=reg.block_size, additional_salt=reg.additionalsalt or "",
        url=reg.url or NO_URL, topic=reg.topic, lora=tuple(sorted(lora.items())),
        endpoint=rank0_endpoint(reg.endpoint, reg.dp_rank, "endpoint"),
        replay_endpoint=None if reg.replay_endpoint is None else rank0_endpoint(
            reg.replay_endpoint, reg.dp_rank, "replay_endpoint"))


def add_rank(wid: WorkerId, current: Instance | None, spec: InstanceSpec, rank: int) -> Instance:
    """The instance once ``rank`` registered with ``spec``: it joins the ranks of the same spec,
    or replaces a lone re-registered rank; 409 while other ranks have another spec."""
    if current is not None and current.spec != spec and current.ranks - {rank}:
        raise ApiError(409, f"instance {wid!r} has dp ranks {sorted(current.ranks)} "
                       "registered with other fields (tenant, type, model, block size, "
                       "salt, endpoints, url, topic, adapters): unregister them first",
                       "id_conflict")
    kept = current.ranks if current is not None and current.spec == spec else set()
    return Instance(spec, kept | {rank})


def check_query(q: QueryBody) -> None:
    """400 for a ``/query`` body this index cannot answer."""
    require_printable(q, "model", "tenant_id", "instance_id", "lora_name", "lora_id")
    if not 1 <= q.block_size <= MAX_PAGE_SIZE:
        raise ApiError(400, f"block_size must be in [1, {MAX_PAGE_SIZE}]", "invalid")
    if len(q.token_ids) > MAX_QUERY_TOKENS:
        raise ApiError(400, f"at most {MAX_QUERY_TOKENS} token_ids", "invalid")
    if q.lora_name and q.lora_id:
        raise ApiError(400, "give lora_name or lora_id, not both", "invalid")
    if q.lora_id is not None:
        try:  # SGLang's lora_id: uuid hex; it is the adapter's extra key
            uuid.UUID(hex=q.lora_id)
        except ValueError:
            raise ApiError(400, "lora_id must be SGLang's adapter id (32 hex digits)",
                           "invalid") from None


def answer_query(q: QueryBody, workers: Mapping[WorkerId, WorkerInfo],
                 instances: Mapping[WorkerId, Instance], match: Match) -> dict[str, Any]:
    """``{tenant: {instance_id: hits}}`` for every candidate of ``workers`` (the query's model,
    block size, tenant and instance), keying and matching once per (namespace, extra key).
    Workers not in ``instances`` (registered elsewhere) are the default tenant's, without
    adapters. ``match`` may raise :class:`IndexRefusal`: nothing held."""
    check_query(q)
    tenant = q.tenant_id or DEFAULT_TENANT
    salt = q.cache_salt or None
    keyed: dict[str | None, list[PageKey]] = {}
    matched: dict[tuple[str, str | None], MatchResult] = {}
    out: dict[str, Any] = {}
    for wid, info in sorted(workers.items()):
        if info.model != q.model or info.page_size != q.block_size:
            continue
        if q.instance_id is not None and wid != q.instance_id:
            continue
        instance = instances.get(wid)
        if (instance.spec.tenant if instance is not None else DEFAULT_TENANT) != tenant:
            continue
        extra_key: str | None = q.lora_id
        if q.lora_name:
            extra_key = dict(instance.spec.lora).get(q.lora_name) if instance else None
            if extra_key is None:  # this instance cannot have keyable pages of it
                out[wid] = hits(info, None, q.block_size)
                continue
        if extra_key not in keyed:
            try:
                keyed[extra_key] = page_keys(q.token_ids, q.block_size, cache_salt=salt,
                                             extra_key=extra_key)
            except ValueError as exc:  # a salt that is no UTF-8 (a lone surrogate)
                raise ApiError(400, f"cannot key the request: {exc}", "invalid") from None
        at = (info.namespace, extra_key)
        if at not in matched:
            try:
                matched[at] = match(Namespace(info.namespace), keyed[extra_key])
            except IndexRefusal:  # its namespace vanished meanwhile: nothing held
                matched[at] = MatchResult(len(keyed[extra_key]), {}, 0, frozenset())
        out[wid] = hits(info, matched[at], q.block_size)
    return {tenant: out}


def hits(info: WorkerInfo, m: MatchResult | None, block_size: int) -> dict[str, Any]:
    """One instance's answer in tokens. Tiers are cumulative, as our ``HolderMatch``: ``GPU`` on
    the device, ``CPU`` on the device or host tier, ``DISK`` at any tier including the L3 pool
    the worker reads (its ``pool_id``, reachable from every rank)."""
    gpu = host = any_tier = 0
    ranks: dict[str, int] = {}
    if m is not None:
        pool = 0
        if info.pool_id is not None:
            pool = max((hm.pool for (h, _), hm in m.matched.items() if h == info.pool_id),
                       default=0)
        for rank in range(info.dp_size):
            hm = m.matched.get((WorkerId(info.worker_id), rank))
            own = hm.pool if hm is not None else 0
            if hm is not None:
                gpu, host = max(gpu, hm.gpu), max(host, hm.host)
            if max(own, pool):
                ranks[str(rank)] = max(own, pool) * block_size
            any_tier = max(any_tier, own, pool)
    return {"longest_matched": any_tier * block_size, "GPU": gpu * block_size,
            "CPU": host * block_size, "DISK": any_tier * block_size, "DP": ranks}
