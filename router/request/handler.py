"""One front-end request, end to end: parse -> tokenize -> page keys -> policy -> forward.

Errors before any compute are answered here with 4xx/5xx JSON (OpenAI error shape); a policy
rejection is 429 with ``Retry-After``. Forwarding happens in :class:`Forward`, an ASGI response that
relays the worker's answer (streamed or whole), retries on another worker when a worker refused
the connection, ends a broken stream with an error event, and aborts the engine request when the
client disconnects. Every outcome reaches the cost model and policy (``RoutingCore.finished``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import uuid
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from radix_global.keys import page_keys
from radix_global.types import Namespace
from router.cluster.registry import WorkerEntry
from router.keying.lora import ModelRef, adapter_extra_key, request_adapter, resolve_model
from router.keying.prompt import GENERATE, is_stream, needs_tokenizer, output_tokens_hint
from router.keying.prompt import prompt_token_ids as _prompt_ids
from router.keying.tenants import TenantError, effective_salt
from router.keying.tokenize import PromptError, model_vocab_size
from router.request.relay import Forward, Routed
from router.routing.admission import DECODE_KV, TBT_SLO
from router.routing.contract import RouteRequest
from router.state import RouterState

log = logging.getLogger("radix_global.router.request.handler")

__all__ = ["Forward", "error", "handle"]


def error(status: int, message: str, kind: str = "invalid_request_error",
          headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}},
                        status_code=status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


class _TooLarge(Exception):
    pass


async def _tokenizer_for(state: RouterState, entry: WorkerEntry) -> Any:
    path = state.config.model_path or entry.model_path
    if not path:
        return None
    tok = state.tokenizers.get(path)
    if tok.loaded:  # the common case: no thread hop (it cost more than the lookup)
        return tok
    try:
        await asyncio.to_thread(tok.load)  # first use loads from disk: not on the event loop
    except Exception as exc:
        log.warning("tokenizer of %s (%s) unavailable: %r", entry.info.model, path, exc)
        return None
    return tok


async def handle(state: RouterState, request: Request, kind: str, upstream_path: str
                 ) -> Response | Forward:
    """Answer one inference request (any of the three front-end shapes)."""
    clock, cfg, m = state.clock, state.config, state.metrics
    t0 = clock()
    try:
        body = await read_body(request, cfg.max_body_bytes)
    except _TooLarge:
        return error(413, f"request body larger than {cfg.max_body_bytes} bytes")
    except ClientDisconnect:
        return Response(status_code=499)
    try:
        payload = msgspec.json.decode(body)  # several times faster than json on token-id lists
    except msgspec.DecodeError as exc:
        return error(400, f"malformed JSON: {exc}")
    if not isinstance(payload, dict):
        return error(400, "request body must be a JSON object")

    models = state.registry.models()
    model = payload.get("model")
    ref = resolve_model(model, models) if isinstance(model, str) else None  # <model>:<adapter>
    if ref is None and (model is None or kind == GENERATE) and len(models) == 1:
        ref = ModelRef(next(iter(models)), None)
    if ref is None:
        if not models:
            return error(503, "no healthy worker", "service_unavailable")
        if model is None:
            return error(400, f"'model' is required; served: {sorted(models)}")
        return error(404, f"unknown model {model!r}; served: {sorted(models)}", "model_not_found")
    model = ref.model
    namespace = models[model]
    entries = state.registry.for_model(model)
    if not any(e.accepting for e in entries):
        return error(503, f"no healthy worker for model {model!r}", "service_unavailable")
    try:
        tenant = state.tenants.resolve(request.headers.get("authorization"))
    except TenantError as exc:
        return error(401, str(exc), "authentication_error")
    salt = effective_salt(tenant, payload.get("cache_salt"))

    t_tok = clock()
    head = entries[0]
    # Token-id prompts never wait for the tokenizer (it may still be loading).
    tok = await _tokenizer_for(state, head) if needs_tokenizer(kind, payload) else None
    path = state.config.model_path or head.model_path
    vocab = model_vocab_size(path) if path else None
    try:
        ids = await asyncio.to_thread(_prompt_ids, kind, payload, tok, vocab) \
            if tok is not None and len(body) > 65536 else _prompt_ids(kind, payload, tok, vocab)
    except PromptError as exc:
        return error(400, str(exc))
    if ids is None:
        state.totals["untokenized"] += 1
    context = cfg.context_length or head.context_length
    if ids is not None and context is not None and len(ids) >= context:
        return error(400, f"prompt has {len(ids)} tokens; the model's context length is "
                     f"{context}", "context_length_exceeded")
    page_size = state.registry.page_size(namespace) or head.info.page_size
    # SGLang reads "<model>:<adapter>" on its OpenAI endpoints only; /generate has lora_path.
    adapter = request_adapter(payload, ref.adapter if kind != GENERATE else None)
    extra_key = adapter_extra_key(adapter, head.lora, state.lora_extra_keys)  # worker's first
    keys = page_keys(ids, page_size, cache_salt=salt, extra_key=extra_key) if ids else []
    m.stage("tokenize").observe(clock() - t_tok)

    given = payload.get("rid")
    rid = given if isinstance(given, str) and given else _next_rid()
    req = RouteRequest(
        request_id=rid, namespace=Namespace(namespace), input_tokens=len(ids) if ids else 0,
        page_keys=keys, page_size=page_size, tenant=tenant.name,
        ttft_slo_s=_float_or_none(payload.get("ttft_slo_s")),
        output_tokens_hint=output_tokens_hint(kind, payload))
    if state.index.remote:  # asked here, async; the policy's match must not block the loop
        await state.index.prefetch_match(req.namespace, keys)
    if cfg.pd_mode == "pool":  # prefill/decode hand-off through the L3 pool (docs/pd.md)
        from router.pd.pool_front import pool_handoff
        return await pool_handoff(state, req, payload, salt, kind, upstream_path, model,
                                  dict(request.headers), t0, lambda x: _route(state, req, model, x))
    first = _route(state, req, model, set())
    if isinstance(first, Response):
        return first
    if state.warmer.enabled and ids:  # token ids of reused prefixes, for hot-prefix warming
        state.warmer.remember(namespace, keys, ids, page_size, first.decision.prefix_tokens)
    return Forward(state, req, payload, salt, kind, upstream_path, model, first,
                   dict(request.headers), stream=is_stream(payload), t0=t0,
                   route=lambda excluded: _route(state, req, model, excluded), raw=body)


_RID_PREFIX = uuid.uuid4().hex[:12]  # unique per router process
_rid_counter = itertools.count()


def _next_rid() -> str:
    # A counter, not uuid4 per request: os.urandom was a measurable cost on a loaded host.
    return f"rg-{_RID_PREFIX}-{next(_rid_counter)}"


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _route(state: RouterState, req: RouteRequest, model: str, excluded: set[str]
           ) -> Routed | Response:
    clock, m = state.clock, state.metrics
    t = clock()
    from router.cluster.slots import worker_states

    slots = worker_states(state.registry.for_model(model), excluded)
    decision = state.routing.route(req, slots, clock())
    m.stage("policy").observe(clock() - t)
    outcome = "accepted" if decision.accepted else (decision.reason or "rejected")
    m.decision(model, outcome).inc()
    state.totals[f"decision_{outcome}"] += 1
    if not decision.accepted:
        if decision.reason in (DECODE_KV, TBT_SLO):  # PD admission: for the utilisation report
            from router.pd.pool_front import pd_util

            pd_util(state).rejected_before_prefill += 1
        if decision.reason == "no_workers":
            return error(503, f"no healthy worker for model {model!r}", "service_unavailable")
        retry = decision.retry_after_s if decision.retry_after_s is not None else 1.0
        state.recent.append({"request_id": req.request_id, "accepted": False,
                             "reason": decision.reason, "retry_after_s": retry})
        return error(429, f"rejected by admission control: {decision.reason}",
                     "rate_limit_exceeded", headers={"Retry-After": str(max(1, math.ceil(retry)))})
    entry = state.registry.find(decision.worker_id or "")
    if entry is None:
        return error(503, "the chosen worker left the pool", "service_unavailable")
    return Routed(decision, entry)

