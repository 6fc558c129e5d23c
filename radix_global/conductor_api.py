"""Mooncake Conductor's indexer HTTP API over the index service's state (issue 37).

Gateways written against Mooncake's Conductor (``POST /register``, ``/unregister``, ``/query``,
``/query_by_hash``) can use radix-global's index without a change of client. The mapping of
their identities onto ours (namespaces, page keys, tiers, holders) and what is refused is
``docs/interfaces.md`` section "Mooncake Conductor's indexer API"; in short:

* ``/register``: one KV-event publisher (one dp rank of an instance) -> our
  :class:`~radix_global.registration.WorkerInfo` (:mod:`radix_global.conductor_mapping`),
  registered through :meth:`ServiceState.register` with every check our registration makes.
  Mooncake has no heartbeats: the API keeps its instances alive until ``/unregister``
  (:meth:`ConductorAPI.keepalive`).
* ``/query``: token ids -> per instance of the model (and block size) the longest leading run
  of our page keys in the index, per tier (cumulative: ``GPU`` <= ``CPU`` <= ``DISK``) and per
  dp rank, in tokens (:func:`radix_global.conductor_mapping.answer_query`).
* ``/query_by_hash``: 501. Their ``seq_hashes`` are XXH3-64 rolling hashes; our keys are
  SGLang's SHA-256 chain and cannot be derived from them.

Who may call: every route (writes and key queries alike, as the gRPC admin calls and ``Match``,
``docs/interfaces.md``, "Index service") needs ``Authorization: Bearer <token>`` when a token is
configured, else a loopback peer that sent no forwarding header (:mod:`radix_global.http_guard`).
Bad requests get a 4xx JSON error ``{"error": ..., "reason": ...}``, never a 500; bodies are
size-bounded. Request bodies and refusals: :mod:`radix_global.conductor_wire`.

This module is the thin part: the ASGI app (:class:`ConductorAPI`), which decodes, authorizes
and calls :class:`ServiceState` and the pure mapping, and its uvicorn server
(:func:`serve_conductor_api`). Every handler runs on the service's event loop (the index is
single-owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from radix_global import http_guard
from radix_global.conductor_mapping import (
    DEFAULT_TENANT,
    Instance,
    add_rank,
    answer_query,
    instance_spec,
)
from radix_global.conductor_wire import (
    ADMIN_BODY_MAX_BYTES,
    QUERY_BODY_MAX_BYTES,
    ApiError,
    QueryBody,
    RegisterBody,
    UnregisterBody,
    decode,
)
from radix_global.http_listener import Listener, companion, listen
from radix_global.ops import IndexRefusal, PageSizeMismatchError
from radix_global.registration import RegistrationError, WorkerInfo, refuse_host_local
from radix_global.service_state import ServiceState
from radix_global.types import WorkerId
from radix_global.wire import IdConflictError, UnknownWorkerError

log = logging.getLogger(__name__)

Handler = Callable[[Request, bytes], Awaitable[dict[str, Any]]]


def _error(status: int, message: str, reason: str) -> JSONResponse:
    return JSONResponse({"error": message, "reason": reason}, status_code=status)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (unknown path, wrong method) as JSON errors too."""
    status = exc.status_code if isinstance(exc, HTTPException) else 400
    reason = {404: "not_found", 405: "method_not_allowed"}.get(status, "invalid")
    return _error(status, str(getattr(exc, "detail", exc)), reason)


class ConductorAPI:
    """The four routes over one :class:`ServiceState`; ``app`` is the ASGI app, ``instances``
    the publishers registered through it."""

    def __init__(self, state: ServiceState, admin_token: str | None = None) -> None:
        self.state = state
        self.admin_token = admin_token or None
        self.instances: dict[WorkerId, Instance] = {}
        self._lock = asyncio.Lock()  # registrations await the subscriber: one at a time
        routes = [Route(path, self._guard(handler, limit), methods=["POST"])
                  for path, handler, limit in (
                      ("/register", self._register, ADMIN_BODY_MAX_BYTES),
                      ("/unregister", self._unregister, ADMIN_BODY_MAX_BYTES),
                      ("/query", self._query, QUERY_BODY_MAX_BYTES),
                      ("/query_by_hash", self._query_by_hash, QUERY_BODY_MAX_BYTES))]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})

    def _guard(self, handler: Handler, limit: int) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not http_guard.authorized(request, self.admin_token):
                return _error(401, http_guard.refusal(self.admin_token), "unauthenticated")
            try:
                body = await http_guard.read_body(request, limit)
                if body is None:
                    raise ApiError(413, f"body larger than {limit} bytes", "too_large")
                return JSONResponse(await handler(request, body))
            except ApiError as exc:
                return _error(exc.status, str(exc), exc.reason)
            except ClientDisconnect:
                return Response(status_code=400)
            except Exception as exc:  # a bug costs one request (500, logged), not the service
                log.exception("conductor API: %s failed", request.url.path)
                return _error(500, f"internal error: {type(exc).__name__}", "internal")
        return endpoint

    async def _register(self, request: Request, body: bytes) -> dict[str, Any]:
        reg = decode(body, RegisterBody)
        spec = instance_spec(reg)
        wid = WorkerId(reg.instance_id)
        async with self._lock:
            current = self.instances.get(wid)
            instance = add_rank(wid, current, spec, reg.dp_rank)
            try:
                info = instance.info(wid)
                if not http_guard.local_caller(request):
                    refuse_host_local(info)  # docs/interfaces.md, "Across hosts"
            except RegistrationError as exc:
                raise ApiError(400, str(exc), "invalid") from None
            known = self.state.workers.get(wid)
            if current is None and known is not None and known != info:
                # the admin API's worker; the same record (restored from a snapshot) is adopted
                raise ApiError(409, f"instance_id {wid!r} is a worker registered through the "
                               "admin API; deregister it there first", "id_conflict")
            subscribed = await self._apply(info, dict(spec.lora))
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
        if lora and (before != info or old is None or dict(old.spec.lora) != dict(lora)):
            subscribed = await self.state.subscriber.add_worker(info, lora_extra_keys=lora)
        return subscribed

    async def _unregister(self, request: Request, body: bytes) -> dict[str, Any]:
        reg = decode(body, UnregisterBody)
        tenant = reg.tenant_id or DEFAULT_TENANT
        wid = WorkerId(reg.instance_id)
        async with self._lock:
            current = self.instances.get(wid)
            if current is None or current.spec.tenant != tenant or \
                    reg.dp_rank not in current.ranks:
                raise ApiError(404, f"no publisher {wid}|{tenant}|{reg.dp_rank} registered "
                               "through /register", "unknown_worker")
            ranks = current.ranks - {reg.dp_rank}
            if not ranks:
                del self.instances[wid]
                with contextlib.suppress(UnknownWorkerError):  # gone already (timed out)
                    await self.state.deregister(wid)
            else:
                instance = Instance(current.spec, ranks)
                await self._apply(instance.info(wid), dict(current.spec.lora))
                self.instances[wid] = instance
        return {"status": "unregistered successfully",
                "removed_instances": [f"{wid}|{tenant}|{reg.dp_rank}"]}

    async def _query(self, request: Request, body: bytes) -> dict[str, Any]:
        q = decode(body, QueryBody)
        now = self.state.clock()
        return answer_query(q, self.state.workers, self.instances,
                            lambda ns, keys: self.state.index.match(ns, keys, now))

    async def _query_by_hash(self, request: Request, body: bytes) -> dict[str, Any]:
        raise ApiError(501, "query_by_hash is not served: its seq_hashes are XXH3-64 rolling "
                       "hashes (Mooncake RFC #1527), while this index keys pages by SGLang's "
                       "SHA-256 page chain (docs/interfaces.md, \"Page keys\"), which cannot be "
                       "derived from them; send the token_ids to /query", "unsupported")

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


def build_conductor_app(state: ServiceState, admin_token: str | None = None) -> ConductorAPI:
    return ConductorAPI(state, admin_token)


async def serve_conductor_api(state: ServiceState, host: str, port: int,
                              admin_token: str | None = None) -> Listener:
    """Serve the API on ``host:port`` (0: any free port) on the running event loop, next to the
    gRPC service; returns once it listens (``radix_global/http_listener.py``)."""
    api = ConductorAPI(state, admin_token)
    listener = await listen(api.app, host, port, "conductor-http")
    companion(listener, api.keepalive(), "conductor-keepalive")
    log.info("conductor API on %s:%d", host, listener.port)
    return listener


@contextlib.asynccontextmanager
async def conductor_api(state: ServiceState, host: str = "127.0.0.1", port: int = 0,
                        admin_token: str | None = None) -> AsyncIterator[Listener]:
    server = await serve_conductor_api(state, host, port, admin_token)
    try:
        yield server
    finally:
        await server.stop()
