"""Mooncake Conductor's indexer HTTP API over the index service's state (issue 37).

Gateways written against Mooncake's Conductor (``POST /register``, ``/unregister``, ``/query``,
``/query_by_hash``) can use radix-global's index without a change of client. The mapping of
their identities onto ours (namespaces, page keys, tiers, holders) and what is refused is
``docs/interfaces.md`` section 21; in short:

* ``/register``: one KV-event publisher (one dp rank of an instance) -> our
  :class:`~radix_global.registration.WorkerInfo` (``worker_id`` = ``instance_id``, namespace
  ``<modelname>@<additionalsalt or 0>``, ``page_size`` = ``block_size``, rank ``r`` at the
  rank-0 endpoint + ``r``), registered through :meth:`ServiceState.register` with every check
  our registration makes. Mooncake has no heartbeats: the API keeps its instances alive until
  ``/unregister`` (:meth:`ConductorAPI.keepalive`).
* ``/query``: token ids -> per instance of the model (and block size) the longest leading run
  of our page keys (:func:`radix_global.keys.page_keys` with ``cache_salt`` and the LoRA
  adapter's extra key) in the index, per tier (cumulative: ``GPU`` <= ``CPU`` <= ``DISK``) and
  per dp rank, in tokens.
* ``/query_by_hash``: 501. Their ``seq_hashes`` are XXH3-64 rolling hashes; our keys are
  SGLang's SHA-256 chain and cannot be derived from them.

Who may call: every route (writes and key queries alike, as the gRPC admin calls and ``Match``,
``docs/interfaces.md`` s. 9) needs ``Authorization: Bearer <token>`` when a token is configured,
else a loopback peer that sent no forwarding header. Bad requests get a 4xx JSON error
``{"error": ..., "reason": ...}``, never a 500; bodies are size-bounded.

Every handler runs on the service's event loop (the index is single-owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from radix_global.endpoints import is_loopback_address
from radix_global.keys import lora_extra_key, page_keys
from radix_global.namespaces import namespace_for
from radix_global.ops import IndexRefusal, MatchResult, PageSizeMismatchError
from radix_global.registration import (
    MAX_DP_SIZE,
    MAX_ID_CHARS,
    MAX_PAGE_SIZE,
    MAX_URL_CHARS,
    RegistrationError,
    WorkerInfo,
    refuse_host_local,
)
from radix_global.service_state import ServiceState
from radix_global.types import Namespace, PageKey, WorkerId
from radix_global.wire import IdConflictError, UnknownWorkerError

log = logging.getLogger(__name__)

ADMIN_BODY_MAX_BYTES = 64 * 1024  # /register, /unregister: a few hundred bytes
QUERY_BODY_MAX_BYTES = 16 * 1024 * 1024  # /query: ~2M token ids as JSON
MAX_QUERY_TOKENS = 1 << 21
MAX_SALT_CHARS = 256  # as a client cache_salt at the router (docs/interfaces.md s. 11)
DEFAULT_TENANT = "default"
# Where an instance registered without a ``url`` "is": a reserved name (RFC 2606) that never
# resolves. The index service never contacts a worker's URL; a router must not route to it.
NO_URL = "http://unknown.invalid"
ENGINES = {"sglang": "sglang", "vllm": "vllm"}  # their ``type``, case-insensitive -> ours
# Headers by which a proxy says who the client was (as router/http/admin.py): with them, a
# loopback peer may be a proxy on this host speaking for anyone.
_FORWARDING = frozenset({"forwarded", "via", "x-real-ip", "true-client-ip", "x-client-ip",
                         "client-ip", "x-cluster-client-ip", "cf-connecting-ip",
                         "fastly-client-ip", "x-original-forwarded-for"})

Text = Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
Endpoint = Annotated[str, msgspec.Meta(max_length=MAX_URL_CHARS)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]


class ApiError(Exception):
    """A refused request: HTTP ``status``, a message and a short ``reason``."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


# ---- request bodies (their field names; unknown fields refused, as our WorkerInfo) -----------
class RegisterBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    endpoint: Endpoint
    type: Text
    modelname: Text
    instance_id: Text
    block_size: int
    dp_rank: int
    replay_endpoint: Endpoint | None = None
    lora_name: Text | None = None
    tenant_id: Text | None = None
    additionalsalt: Text | None = None
    # Ours, optional: what Mooncake's record lacks.
    url: Endpoint | None = None  # the engine's HTTP base URL (default NO_URL)
    topic: Text = ""  # ZMQ topic to subscribe; "" = every topic, as Mooncake's client
    lora_paths: dict[Text, Endpoint] | None = None  # SGLang --lora-paths name -> path


class UnregisterBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    instance_id: Text
    dp_rank: int
    tenant_id: Text | None = None
    type: Text | None = None  # accepted and ignored, as Mooncake does: the key is
    modelname: Text | None = None  # (instance_id, tenant_id, dp_rank)
    lora_name: Text | None = None
    block_size: int | None = None


class QueryBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: Text
    token_ids: list[TokenId]
    block_size: int
    tenant_id: Text | None = None
    instance_id: Text | None = None
    lora_name: Text | None = None
    lora_id: Text | None = None  # deprecated in their API; here SGLang's lora_id (extra key)
    cache_salt: Annotated[str, msgspec.Meta(max_length=MAX_SALT_CHARS)] | None = None


# ---- the instances registered through this API ------------------------------------------------
@dataclass(frozen=True)
class _Common:
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
class _Instance:
    common: _Common
    ranks: set[int] = field(default_factory=set)

    def info(self, worker_id: str) -> WorkerInfo:
        c = self.common
        return WorkerInfo(
            worker_id=worker_id, url=c.url, model=c.model,
            namespace=namespace_for(c.model, None, c.additional_salt or None),
            page_size=c.block_size, dp_size=max(self.ranks) + 1, engine=c.engine,
            kv_events_endpoint=c.endpoint, kv_events_replay_endpoint=c.replay_endpoint,
            kv_events_topic=c.topic)


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


def _printable(value: str | None, name: str) -> None:
    if value is not None and not value.isprintable():
        raise ApiError(400, f"{name} must be printable", "invalid")


def _decode(body: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"bad request: {exc}", "invalid") from None
    except (msgspec.DecodeError, RecursionError, ValueError) as exc:
        raise ApiError(400, f"malformed JSON: {str(exc)[:200]}", "invalid") from None


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (unknown path, wrong method) as JSON errors too."""
    status = exc.status_code if isinstance(exc, HTTPException) else 400
    reason = {404: "not_found", 405: "method_not_allowed"}.get(status, "invalid")
    return _error(status, str(getattr(exc, "detail", exc)), reason)


def _error(status: int, message: str, reason: str) -> JSONResponse:
    return JSONResponse({"error": message, "reason": reason}, status_code=status)


class ConductorAPI:
    """The four routes over one :class:`ServiceState`; ``app`` is the ASGI app."""

    def __init__(self, state: ServiceState, admin_token: str | None = None) -> None:
        self.state = state
        self.admin_token = admin_token or None
        self.instances: dict[WorkerId, _Instance] = {}
        self._lock = asyncio.Lock()  # registrations await the subscriber: one at a time
        routes = [Route(path, self._guard(handler, limit), methods=["POST"])
                  for path, handler, limit in (
                      ("/register", self._register, ADMIN_BODY_MAX_BYTES),
                      ("/unregister", self._unregister, ADMIN_BODY_MAX_BYTES),
                      ("/query", self._query, QUERY_BODY_MAX_BYTES),
                      ("/query_by_hash", self._query_by_hash, QUERY_BODY_MAX_BYTES))]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})

    # ---- plumbing -----------------------------------------------------------------------------
    def _authorized(self, request: Request) -> bool:
        if self.admin_token is None:
            return _loopback_peer(request) and not _proxied(request)
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.admin_token}".encode())

    def _guard(self, handler: Callable[[Request, bytes], Any], limit: int
               ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            if not self._authorized(request):
                why = ("missing or wrong admin token (header 'Authorization: Bearer <token>')"
                       if self.admin_token else "no admin token configured: only loopback "
                       "clients, without forwarding headers")
                return _error(401, why, "unauthenticated")
            try:
                body = await _read_body(request, limit)
                return JSONResponse(await handler(request, body))
            except ApiError as exc:
                return _error(exc.status, str(exc), exc.reason)
            except ClientDisconnect:
                return Response(status_code=400)
            except Exception as exc:  # a bug costs one request (500, logged), not the service
                log.exception("conductor API: %s failed", request.url.path)
                return _error(500, f"internal error: {type(exc).__name__}", "internal")
        return endpoint

    # ---- /register ----------------------------------------------------------------------------
    async def _register(self, request: Request, body: bytes) -> dict[str, Any]:
        reg: RegisterBody = _decode(body, RegisterBody)
        for name in ("type", "modelname", "instance_id", "tenant_id", "additionalsalt",
                     "lora_name", "topic"):
            _printable(getattr(reg, name), name)
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
        common = _Common(
            tenant=reg.tenant_id or DEFAULT_TENANT, engine=engine, model=reg.modelname,
            block_size=reg.block_size, additional_salt=reg.additionalsalt or "",
            url=reg.url or NO_URL, topic=reg.topic, lora=tuple(sorted(lora.items())),
            endpoint=rank0_endpoint(reg.endpoint, reg.dp_rank, "endpoint"),
            replay_endpoint=None if reg.replay_endpoint is None else rank0_endpoint(
                reg.replay_endpoint, reg.dp_rank, "replay_endpoint"))
        wid = WorkerId(reg.instance_id)
        async with self._lock:
            current = self.instances.get(wid)
            if current is not None and current.common != common and \
                    current.ranks - {reg.dp_rank}:
                raise ApiError(409, f"instance {wid!r} has dp ranks {sorted(current.ranks)} "
                               "registered with other fields (tenant, type, model, block size, "
                               "salt, endpoints, url, topic, adapters): unregister them first",
                               "id_conflict")
            ranks = (current.ranks if current is not None and current.common == common
                     else set()) | {reg.dp_rank}
            instance = _Instance(common, ranks)
            try:
                info = instance.info(wid)
                if not _loopback_peer(request) or _proxied(request):
                    refuse_host_local(info)  # docs/interfaces.md s. 12
            except RegistrationError as exc:
                raise ApiError(400, str(exc), "invalid") from None
            known = self.state.workers.get(wid)
            if current is None and known is not None and known != info:
                # the admin API's worker; the same record (restored from a snapshot) is adopted
                raise ApiError(409, f"instance_id {wid!r} is a worker registered through the "
                               "admin API; deregister it there first", "id_conflict")
            subscribed = await self._apply(info, lora)
            self.instances[wid] = instance
        return {"status": "registered successfully", "instance_id": wid,
                "namespace": info.namespace, "dp_size": info.dp_size, "subscribed": subscribed}

    async def _apply(self, info: WorkerInfo, lora: Mapping[str, str]) -> bool:
        """Register ``info`` with the service; with adapters, follow its events with their extra
        keys (``ServiceState.register`` takes no LoRA map: the feed is replaced once more, at
        join, so nothing is lost: the subscriber catches up from seq 0)."""
        before = self.state.workers.get(WorkerId(info.worker_id))
        try:
            subscribed = await self.state.register(info)
        except (IdConflictError, PageSizeMismatchError) as exc:
            raise ApiError(409, str(exc), "conflict") from None
        except (RegistrationError, IndexRefusal) as exc:
            raise ApiError(400, str(exc), "invalid") from None
        old = self.instances.get(WorkerId(info.worker_id))
        if lora and (before != info or old is None or dict(old.common.lora) != dict(lora)):
            subscribed = await self.state.subscriber.add_worker(info, lora_extra_keys=lora)
        return subscribed

    # ---- /unregister --------------------------------------------------------------------------
    async def _unregister(self, request: Request, body: bytes) -> dict[str, Any]:
        reg: UnregisterBody = _decode(body, UnregisterBody)
        tenant = reg.tenant_id or DEFAULT_TENANT
        wid = WorkerId(reg.instance_id)
        async with self._lock:
            current = self.instances.get(wid)
            if current is None or current.common.tenant != tenant or \
                    reg.dp_rank not in current.ranks:
                raise ApiError(404, f"no publisher {wid}|{tenant}|{reg.dp_rank} registered "
                               "through /register", "unknown_worker")
            ranks = current.ranks - {reg.dp_rank}
            if not ranks:
                del self.instances[wid]
                with contextlib.suppress(UnknownWorkerError):  # gone already (timed out)
                    await self.state.deregister(wid)
            else:
                instance = _Instance(current.common, ranks)
                await self._apply(instance.info(wid), dict(current.common.lora))
                self.instances[wid] = instance
        return {"status": "unregistered successfully",
                "removed_instances": [f"{wid}|{tenant}|{reg.dp_rank}"]}

    # ---- /query -------------------------------------------------------------------------------
    async def _query(self, request: Request, body: bytes) -> dict[str, Any]:
        q: QueryBody = _decode(body, QueryBody)
        for name in ("model", "tenant_id", "instance_id", "lora_name", "lora_id"):
            _printable(getattr(q, name), name)
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
        tenant = q.tenant_id or DEFAULT_TENANT
        salt = q.cache_salt or None
        keyed: dict[str | None, list[PageKey]] = {}
        matched: dict[tuple[str, str | None], MatchResult] = {}
        now = self.state.clock()
        out: dict[str, Any] = {}
        for wid, info in sorted(self.state.workers.items()):
            if info.model != q.model or info.page_size != q.block_size:
                continue
            if q.instance_id is not None and wid != q.instance_id:
                continue
            instance = self.instances.get(wid)
            if (instance.common.tenant if instance is not None else DEFAULT_TENANT) != tenant:
                continue
            extra_key: str | None = q.lora_id
            if q.lora_name:
                extra_key = dict(instance.common.lora).get(q.lora_name) if instance else None
                if extra_key is None:  # this instance cannot have keyable pages of it
                    out[wid] = _hits(info, None, q.block_size)
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
                    matched[at] = self.state.index.match(Namespace(info.namespace),
                                                         keyed[extra_key], now)
                except IndexRefusal:  # its namespace vanished meanwhile: nothing held
                    matched[at] = MatchResult(len(keyed[extra_key]), {}, 0, frozenset())
            out[wid] = _hits(info, matched[at], q.block_size)
        return {tenant: out}

    async def _query_by_hash(self, request: Request, body: bytes) -> dict[str, Any]:
        raise ApiError(501, "query_by_hash is not served: its seq_hashes are XXH3-64 rolling "
                       "hashes (Mooncake RFC #1527), while this index keys pages by SGLang's "
                       "SHA-256 page chain (docs/interfaces.md s. 3), which cannot be derived "
                       "from them; send the token_ids to /query", "unsupported")

    # ---- liveness -----------------------------------------------------------------------------
    def heartbeat_all(self) -> None:
        """Mooncake's API has no heartbeats: a publisher stays registered until /unregister.
        Instances the service forgot meanwhile (deregistered elsewhere) leave the table."""
        for wid in list(self.instances):
            try:
                self.state.heartbeat(wid)
            except UnknownWorkerError:
                self.instances.pop(wid, None)

    async def keepalive(self, interval_s: float | None = None) -> None:
        period = interval_s or max(0.05, min(5.0, self.state.subscriber.timeout_s / 4))
        while True:
            self.heartbeat_all()
            await asyncio.sleep(period)


def _hits(info: WorkerInfo, m: MatchResult | None, block_size: int) -> dict[str, Any]:
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


def _proxied(request: Request) -> bool:
    return any(k in _FORWARDING or k.startswith("x-forwarded-") for k in request.headers)


def _loopback_peer(request: Request) -> bool:
    return request.client is not None and is_loopback_address(request.client.host)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise ApiError(413, f"body larger than {limit} bytes", "too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body larger than {limit} bytes", "too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def build_conductor_app(state: ServiceState, admin_token: str | None = None) -> ConductorAPI:
    return ConductorAPI(state, admin_token)


class ConductorServer:
    """A running API: ``port`` (the bound one), ``await stop()``."""

    def __init__(self, api: ConductorAPI, server: Any, tasks: list[asyncio.Task[Any]]) -> None:
        self.api, self._server, self._tasks = api, server, tasks
        self.port = 0

    async def stop(self) -> None:
        self._server.should_exit = True
        for task in self._tasks:
            if task.get_name() == "conductor-keepalive":
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def serve_conductor_api(state: ServiceState, host: str, port: int,
                              admin_token: str | None = None) -> ConductorServer:
    """Serve the API on ``host:port`` (0: any free port) on the running event loop, next to the
    gRPC service; returns once it listens. Signals stay the caller's (uvicorn's own handlers
    would replace the index service's)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    api = ConductorAPI(state, admin_token)
    config = uvicorn.Config(api.app, host=host, port=port, log_level="warning",
                            log_config=None, access_log=False, lifespan="off", ws="none",
                            proxy_headers=False,  # the peer is the socket's, never a header's
                            timeout_keep_alive=5, limit_concurrency=1024)
    server = _Server(config)
    serving = asyncio.create_task(server.serve(), name="conductor-http")
    while not server.started:
        if serving.done():  # uvicorn exits (SystemExit) when it cannot bind
            with contextlib.suppress(BaseException):
                serving.result()
            raise OSError(f"conductor API cannot listen on {host}:{port}")
        await asyncio.sleep(0.01)
    keepalive = asyncio.create_task(api.keepalive(), name="conductor-keepalive")
    handle = ConductorServer(api, server, [serving, keepalive])
    handle.port = server.servers[0].sockets[0].getsockname()[1]
    log.info("conductor API on %s:%d", host, handle.port)
    return handle


@contextlib.asynccontextmanager
async def conductor_api(state: ServiceState, host: str = "127.0.0.1", port: int = 0,
                        admin_token: str | None = None) -> AsyncIterator[ConductorServer]:
    server = await serve_conductor_api(state, host, port, admin_token)
    try:
        yield server
    finally:
        await server.stop()
