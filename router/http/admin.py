"""``/admin/*``: worker registration (docs/interfaces.md section "Worker registration"), stats and
diagnostics.

Every call needs the admin token, as ``Authorization: Bearer <token>`` or, for a browser's reads
(the ``/dashboard`` page), HTTP Basic with the token as the password (any user name); with no
token configured, only loopback clients are accepted. A write that a web page made (the browser
says so in ``Sec-Fetch-Site`` / ``Origin``) is refused whatever it carries: cached logins ride
along with cross-site form posts.
"""

from __future__ import annotations

import base64
import hmac
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from radix_global.endpoints import is_loopback_address
from radix_global.pool_loads import PoolLoadError, decode_report
from radix_global.registration import (
    RegistrationError,
    WorkerInfo,
    decode_worker_info,
    refuse_host_local,
)
from router.cluster.discovery import ServerInfoError, check_server_info, model_of_server
from router.cluster.load_reports import LoadOutcome
from router.cluster.registry import RegistryError, Source
from router.request.handler import read_body
from router.state import RouterState, key_mismatch
from router.transport.errors import ErrorType, HttpError, error_response

# Headers by which some proxy says who the client was: their presence means the loopback peer
# may be a proxy speaking for anyone (the server never rewrites the peer from them).
_FORWARDING = frozenset({"forwarded", "via", "x-real-ip", "true-client-ip", "x-client-ip",
                         "client-ip", "x-cluster-client-ip", "cf-connecting-ip",
                         "fastly-client-ip", "x-original-forwarded-for"})
ADMIN_BODY_MAX_BYTES = 64 * 1024  # a registration is a few hundred bytes


def _proxied(request: Request) -> bool:
    return any(k in _FORWARDING or k.startswith("x-forwarded-") for k in request.headers)


_READS = frozenset({"GET", "HEAD"})


def _from_a_web_page(request: Request) -> bool:
    """A request a browser made for some page (cross-site request forgery): browsers say so in
    ``Sec-Fetch-Site`` or ``Origin``; the router's clients (curl, the wrapper, SDKs) send
    neither."""
    site = request.headers.get("sec-fetch-site")
    return (site is not None and site not in ("same-origin", "none")) or \
        (request.headers.get("origin") is not None and site != "same-origin")


def _loopback_peer(request: Request) -> bool:
    return request.client is not None and is_loopback_address(request.client.host)


def _authorized(state: RouterState, request: Request) -> bool:
    if request.method not in _READS and _from_a_web_page(request):
        return False
    token = state.config.admin.resolved_token()
    if token is None:
        # Without a token: loopback peers only, and not through a reverse proxy on this host
        # (the server does not rewrite the peer from forwarding headers: it would be loopback).
        return _loopback_peer(request) and not _proxied(request)
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() == "basic":
        # A browser sends a cached Basic login with any page's form post: reads only
        if request.method not in _READS:
            return False
        try:
            given = "Bearer " + base64.b64decode(value, validate=True).decode().partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            return False
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def diagnostics(state: RouterState) -> dict[str, Any]:
    """Router/engine disagreements, each a finding with a reason (never a silent zero hit rate)."""
    findings: list[dict[str, Any]] = []
    n = state.config.mismatch.min_requests
    for e in state.registry.all():
        wid = e.info.worker_id
        if key_mismatch(e, n):
            findings.append({"worker_id": wid, "problem": "predicted_hits_never_observed",
                             "detail": f"{e.expected_hits} requests routed for a cached prefix, "
                             "the engine reported no cached tokens: page size, tokenizer, chat "
                             "template, salt or model version differ between router and engine"})
        if e.routed >= n and e.expected_hits == 0 and e.observed_hits >= n // 2:
            findings.append({"worker_id": wid, "problem": "engine_hits_not_indexed",
                             "detail": f"engine reported {e.observed_hits} cache hits the index "
                             "never predicted: KV events are not arriving or keys differ"})
        if not e.info.kv_events_endpoint:
            findings.append({"worker_id": wid, "problem": "no_kv_events",
                             "detail": "worker publishes no KV events: routing is cache-blind"})
    if state.totals.get("untokenized"):
        findings.append({"problem": "untokenized_requests", "count": state.totals["untokenized"],
                         "detail": "no tokenizer for the model: requests routed cache-blind"})
    return {"findings": findings}


def stats(state: RouterState) -> dict[str, Any]:
    workers = []
    own = state.view.own()  # this router's work per slot, as it publishes it
    for e in state.registry.all():
        item = e.to_json()
        item["outstanding"] = sum(state.routing.cost.outstanding((e.worker_id, r))
                                  for r in range(e.info.dp_size))
        item["prefilling"] = sum(own[s].prefilling for s in own if s[0] == e.worker_id)
        workers.append(item)
    return {
        "uptime_s": round(state.clock() - state.started_clock, 3),
        "policy": state.config.policy.name,
        "models": state.registry.models(),
        "totals": dict(state.totals),
        "outstanding": state.routing.in_flight(),
        "profiles": state.profiler.outcomes,
        "profiling_pending": state.profiler.pending(),
        "workers": workers,
        "index": state.index.stats(),
        "cost_model": state.routing.cost.stats(),
        "economics": state.economics.stats(),  # what the cache was worth, per model
        "economics_top_tenants": state.economics.top_tenants(),
        "admission": state.admission.stats(),  # accepted, SLOs met, false rejections
        "recent": list(state.recent)[-50:],
        "pd": state.pd_report(),  # prefill/decode utilisation (pool mode), else None
        "coordination": _coordination(state),  # several routers, one view; None when alone
        # where hosts are, the links and what measured loads made of them
        "topology": {**state.places.report(), "loads": dict(state.loads.outcomes)},
        "copies": state.copies.stats(),  # copies of hot prefixes in other fault domains
    }


PEER_LOAD_MAX_SLOTS = 256  # bounded: a stats answer must stay small at any cluster size


def _coordination(state: RouterState) -> dict[str, Any] | None:
    """The link's stats, with ``peer_load``: the slots some peer has work on (at most
    :data:`PEER_LOAD_MAX_SLOTS`), each ``[worker, rank, requests, prefilling, prefill_tokens,
    decode_tokens, held]`` as this router counts them now."""
    out, link = state.view.stats(), state.view.link
    if out is None or link is None:
        return out
    now = link.clock()
    out["peer_load"] = [[worker, rank, *link.peers.load((worker, rank), now)[:5]]
                        for worker, rank in sorted(link.peers.slots())[:PEER_LOAD_MAX_SLOTS]]
    return out


def guard(state: RouterState, fn: Any) -> Any:
    """``fn`` behind the admin check; a refusal (``HttpError``, a registry's) is its status, a gone
    client 499."""
    async def endpoint(request: Request) -> Response:
        if not _authorized(state, request):
            # a browser asks for the token (as the password) and sends it with each request
            return error_response(401, "admin token required", ErrorType.AUTHENTICATION,
                                  {"www-authenticate": 'Basic realm="radix-global admin"'})
        try:
            return await fn(request)
        except HttpError as exc:
            return exc.response()
        except RegistryError as exc:
            return error_response(exc.status, str(exc))
        except ClientDisconnect:
            return Response(status_code=499)
    return endpoint


def admin_routes(state: RouterState) -> list[Route]:
    def guarded(fn: Any) -> Any:
        return guard(state, fn)

    async def register(request: Request) -> Response:
        body = await read_body(request, ADMIN_BODY_MAX_BYTES, "registration")
        try:
            info = decode_worker_info(body)
            if not _loopback_peer(request) or _proxied(request):  # from another host
                refuse_host_local(info)
        except RegistrationError as exc:
            return error_response(400, f"bad registration: {exc}")
        # What the worker reports of itself is asked and checked before it joins: a worker whose
        # /server_info the router cannot use is refused here, not left registered after a 500.
        old = state.registry.find(info.worker_id)
        known = old is not None and old.info == info and old.model_path is not None
        learned: tuple[str | None, int | None] | None = None
        if not known and state.config.models.model_path is None:
            try:
                learned = await _learn_model(state, info)
            except ServerInfoError as exc:
                if old is not None:  # the process answering now is not the one we knew
                    state.registry.remove(info.worker_id)
                return error_response(400, f"worker {info.worker_id} refused: {exc}")
        model_path, context = learned or (None, None)
        entry = state.registry.add(info, Source.REGISTERED, state.clock(),
                                   model_path=model_path, context_length=context)
        if learned is not None:
            state.prewarm(entry)
        state.view.admitted(entry)  # for the other routers (a coordination service)
        return JSONResponse({"worker_id": info.worker_id}, status_code=201)

    async def remove(request: Request) -> Response:
        wid = request.path_params["worker_id"]
        state.registry.remove(wid)
        if state.view.writes is not None:
            state.view.writes.worker_removed(wid)
        return JSONResponse({"removed": wid})

    async def drain(request: Request) -> Response:
        wid = request.path_params["worker_id"]
        state.registry.drain(wid)
        if state.view.writes is not None:
            state.view.writes.worker_drained(wid)
        return JSONResponse({"draining": wid})

    async def heartbeat(request: Request) -> Response:
        state.registry.heartbeat(request.path_params["worker_id"], state.clock())
        state.worker_alive(request.path_params["worker_id"])
        return JSONResponse({"ok": True})

    async def listing(request: Request) -> Response:
        return JSONResponse({"workers": [e.to_json() for e in state.registry.all()]})

    async def pool_loads(request: Request) -> Response:
        body = await read_body(request, ADMIN_BODY_MAX_BYTES, "pool load report")
        try:
            report = decode_report(body)
        except PoolLoadError as exc:
            return error_response(400, f"bad pool load report: {exc}")
        if not any(e.info.pool_id == report.pool_id for e in state.registry.all()):
            return error_response(404, f"no registered worker has pool {report.pool_id!r}")
        outcomes = state.loads.apply(report, state.clock())
        return JSONResponse({o.value: outcomes[o] for o in LoadOutcome})

    async def pool_copies(request: Request) -> Response:
        pool_id = request.query_params.get("pool_id", "")
        if not any(e.info.pool_id == pool_id for e in state.registry.all()):
            return error_response(404, f"no registered worker has pool {pool_id!r}")
        take = request.query_params.get("orders", "1")
        if take not in ("0", "1"):
            return error_response(400, f"orders must be 0 or 1, got {take[:20]!r}")
        # orders=0: a rank that only listens for the lost hosts leaves the orders waiting
        return JSONResponse({"orders": state.copies.take(pool_id) if take == "1" else [],
                             "lost_hosts": state.lost_hosts.hosts()})

    async def stats_ep(request: Request) -> Response:
        return JSONResponse(stats(state))

    async def diag_ep(request: Request) -> Response:
        return JSONResponse(diagnostics(state))

    return [
        Route("/admin/workers", guarded(register), methods=["POST"]),
        Route("/admin/workers", guarded(listing), methods=["GET"]),
        Route("/admin/workers/{worker_id}", guarded(remove), methods=["DELETE"]),
        Route("/admin/workers/{worker_id}/drain", guarded(drain), methods=["POST"]),
        Route("/admin/workers/{worker_id}/heartbeat", guarded(heartbeat), methods=["POST"]),
        Route("/admin/pool-loads", guarded(pool_loads), methods=["POST"]),
        Route("/admin/pool-copies", guarded(pool_copies), methods=["GET"]),
        Route("/admin/stats", guarded(stats_ep), methods=["GET"]),
        Route("/admin/diagnostics", guarded(diag_ep), methods=["GET"]),
    ]


async def _learn_model(state: RouterState, info: WorkerInfo
                       ) -> tuple[str | None, int | None] | None:
    """A registering worker's tokenizer folder and context length from its ``/server_info``;
    None when it does not answer one (a non-SGLang engine: keys stay unknown).
    :class:`ServerInfoError` when it answers values the router cannot use (a page size or
    context length out of bounds or not an integer, a name that is not a string)."""
    try:
        resp = await state.proxy.client.get(f"{info.url}/server_info",
                                            timeout=state.config.health.health_check_timeout_s)
        server = resp.json() if resp.status_code == 200 else None
    except Exception:  # the worker may not serve /server_info (non-SGLang): keys stay unknown
        server = None
    if not isinstance(server, dict):
        return None
    report = check_server_info(server)  # all of it: a worker reporting garbage is broken
    if report.page_size is not None and report.page_size != info.page_size:
        raise ServerInfoError(f"/server_info reports page_size = {report.page_size} but the "
                              f"registration says {info.page_size}: the router's page keys "
                              "would never match the engine's")
    return model_of_server(report, state.config.models)
