"""One front-end request, end to end: parse -> tokenize -> page keys -> route -> forward.

Errors before any compute are answered here with 4xx/5xx JSON (``router/transport/errors.py``);
a policy rejection is 429 with ``Retry-After``. The answer for a routed request is an ASGI
response that forwards it: :class:`router.request.relay.Forward` (retries on another worker
when one refused the connection, relays the answer, aborts the engine request when the client
disconnects), or :class:`router.request.pool_relay.PoolForward` for a pool PD hand-off.

What the router decides for the client, never the client itself: the engine request id
(``Inbound.req.request_id``; a client's ``rid`` is only a label), and the ``cache_salt``
(``router/keying/tenants.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp

from radix_global.keys import page_keys
from radix_global.types import Namespace, PageKey
from router.cluster.prefix_tokens import WarmScope
from router.cluster.registry import WorkerEntry
from router.keying.lora import ModelRef, adapter_extra_key, request_adapter, resolve_model
from router.keying.prompt import (
    GENERATE,
    batch_size,
    is_stream,
    needs_tokenizer,
    output_tokens_hint,
)
from router.keying.prompt import prompt_token_ids as _prompt_ids
from router.keying.tenants import TenantError, effective_salt
from router.keying.tokenize import ModelTokenizer, PromptError, model_vocab_size
from router.request.inbound import Inbound, client_rid_label, new_rid
from router.request.pool_relay import PoolForward
from router.request.relay import Forward
from router.request.route import prefetch_matches, route_when_released
from router.routing.contract import RouteRequest
from router.state import RouterState
from router.transport.errors import ErrorType, error_response
from router.transport.proxy import forward_headers

log = logging.getLogger("radix_global.router.request")

# A prompt whose body is longer than this many bytes per token of the context cannot fit (no
# tokenizer's average token is that long, and a token id is at most 10 digits and a separator):
# refused before tokenizing, which would cost seconds of CPU for a body of megabytes, and before
# a held request keeps a body of junk in memory.
MAX_BYTES_PER_TOKEN = 32
BYTES_SLACK = 256 * 1024  # the rest of a body: sampling parameters, tool schemas, ...
THREAD_TOKENIZE_BYTES = 65536  # larger prompts are tokenized off the event loop


async def read_body(request: Request, limit: int) -> bytes | None:
    """The whole body, or None when it is larger than ``limit`` (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(body: bytes) -> dict[str, Any] | Response:
    try:
        payload = msgspec.json.decode(body)  # several times faster than json on token-id lists
    except msgspec.DecodeError as exc:
        return error_response(400, f"malformed JSON: {exc}")
    except RecursionError:
        return error_response(400, "JSON nested too deeply")
    if not isinstance(payload, dict):
        return error_response(400, "request body must be a JSON object")
    return payload


async def tokenizer_for(state: RouterState, entry: WorkerEntry) -> Any:
    """The tokenizer of ``entry``'s model, loaded off the event loop on first use; None when the
    router has none for it (no model folder, or it failed to load)."""
    path = state.config.models.model_path or entry.model_path
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


def _model_of(state: RouterState, payload: dict[str, Any], kind: str
              ) -> ModelRef | Response:
    models = state.registry.models()
    model = payload.get("model")
    ref = resolve_model(model, models) if isinstance(model, str) else None  # <model>:<adapter>
    if ref is None and (model is None or kind == GENERATE) and len(models) == 1:
        ref = ModelRef(next(iter(models)), None)
    if ref is not None:
        return ref
    if not models:
        return error_response(503, "no healthy worker", ErrorType.UNAVAILABLE)
    if model is None:
        return error_response(400, f"'model' is required; served: {sorted(models)}")
    return error_response(404, f"unknown model {str(model)[:200]!r}; served: {sorted(models)}",
                          ErrorType.MODEL_NOT_FOUND)


async def handle(state: RouterState, request: Request, kind: str, upstream_path: str
                 ) -> Response | ASGIApp:
    """Answer one inference request (any of the three front-end shapes)."""
    clock, cfg = state.clock, state.config
    t0 = clock()
    try:
        body = await read_body(request, cfg.client.max_body_bytes)
    except ClientDisconnect:
        return Response(status_code=499)
    if body is None:
        return error_response(413, f"request body larger than {cfg.client.max_body_bytes} bytes")
    payload = decode_json(body)
    if isinstance(payload, Response):
        return payload
    ref = _model_of(state, payload, kind)
    if isinstance(ref, Response):
        return ref
    entries = state.registry.for_model(ref.model)
    if not any(e.accepting for e in entries):
        return error_response(503, f"no healthy worker for model {ref.model!r}",
                              ErrorType.UNAVAILABLE)
    try:
        tenant = state.tenants.resolve(request.headers.get("authorization"))
        salt = effective_salt(tenant, payload.get("cache_salt"))
        batch = batch_size(kind, payload)
        client_rid = client_rid_label(payload.get("rid"), batch)
    except TenantError as exc:
        return error_response(401, str(exc), ErrorType.AUTHENTICATION)
    except ValueError as exc:  # a client salt or rid the router will not take (ClientRidError)
        return error_response(400, str(exc))
    # Read before the awaits below (a worker may leave meanwhile); one model, one namespace.
    keyed = await _keyed(state, entries[0], payload, body, kind, ref,
                         Namespace(entries[0].info.namespace), salt, tenant.name)
    if isinstance(keyed, Response):
        return keyed
    req, ids, scope = keyed
    inbound = Inbound(req, payload, body, salt, kind, upstream_path, ref.model,
                      forward_headers(request.headers), is_stream(payload), t0, client_rid, batch)
    await prefetch_matches(state, req)
    if state.pd_pool is not None:  # prefill/decode hand-off through the L3 pool (docs/pd.md)
        await state.pd_pool.learn_capacity(entries)
    first = await route_when_released(state, inbound, request.scope, request.receive)
    if isinstance(first, Response):
        return first
    if state.warmer.enabled and ids:  # token ids of reused prefixes, for hot-prefix warming
        state.warmer.remember(req.namespace, req.page_keys, ids, req.page_size,
                              first.decision.prefix_tokens, scope)
    if state.pd_pool is not None and first.decision.decode_worker_id is not None:
        return PoolForward(state, state.pd_pool, inbound, first)
    return Forward(state, inbound, first)


async def _keyed(state: RouterState, head: WorkerEntry, payload: dict[str, Any], body: bytes,
                 kind: str, ref: ModelRef, namespace: Namespace, salt: str | None, tenant: str
                 ) -> tuple[RouteRequest, list[int] | None, WarmScope] | Response:
    """The request as the routing core sees it: token ids -> page keys in its namespace (and
    that namespace as an engine request names it: the salt and the adapter)."""
    clock, cfg = state.clock, state.config
    t_tok = clock()
    context = cfg.models.context_length or head.context_length
    text = needs_tokenizer(kind, payload)
    if context is not None and len(body) > context * MAX_BYTES_PER_TOKEN + BYTES_SLACK:
        return error_response(400, f"request body of {len(body)} bytes cannot fit the model's "
                              f"context length of {context} tokens", ErrorType.CONTEXT_LENGTH)
    # Token-id prompts never wait for the tokenizer (it may still be loading).
    tok = await tokenizer_for(state, head) if text else None
    path = cfg.models.model_path or head.model_path
    vocab = model_vocab_size(path) if path else None
    try:
        ids = await asyncio.to_thread(_prompt_ids, kind, payload, tok, vocab) \
            if tok is not None and len(body) > THREAD_TOKENIZE_BYTES \
            else _prompt_ids(kind, payload, tok, vocab)
    except PromptError as exc:
        return error_response(400, str(exc))
    if ids is None:
        state.totals["untokenized"] += 1
    if ids is not None and context is not None and len(ids) >= context:
        return error_response(400, f"prompt has {len(ids)} tokens; the model's context length "
                              f"is {context}", ErrorType.CONTEXT_LENGTH)
    page_size = state.registry.page_size(namespace) or head.info.page_size
    # SGLang reads "<model>:<adapter>" on its OpenAI endpoints only; /generate has lora_path.
    adapter = request_adapter(payload, ref.adapter if kind != GENERATE else None)
    extra_key = adapter_extra_key(adapter, head.lora, state.lora_extra_keys)  # worker's first
    keys = page_keys(ids, page_size, cache_salt=salt, extra_key=extra_key) if ids else []
    shared: list[PageKey] = []
    if ids and keys and salt and extra_key is None and len(state.shared_prefixes):
        shared = await _shared_keys(state, head, ref.model, namespace, ids, page_size, salt,
                                    keys[0], tok)
    state.metrics.stage("tokenize").observe(clock() - t_tok)
    slo = payload.get("ttft_slo_s")
    if slo is not None and not _positive(slo):
        return error_response(400, "'ttft_slo_s' must be a positive number of seconds")
    return RouteRequest(
        request_id=new_rid(), namespace=namespace,
        input_tokens=len(ids) if ids else 0, page_keys=keys, page_size=page_size, tenant=tenant,
        ttft_slo_s=float(slo) if slo is not None else None,
        output_tokens_hint=output_tokens_hint(kind, payload), shared_keys=shared), ids, \
        WarmScope(salt, adapter)


async def _shared_keys(state: RouterState, head: WorkerEntry, model: str, namespace: Namespace,
                       ids: list[int], page_size: int, salt: str, first: PageKey,
                       tok: ModelTokenizer | None) -> list[PageKey]:
    """The canonical keys of the request's leading pages that are a registered platform prefix
    (none: no such page), remembered for the workers' alias questions (interfaces.md,
    "Shared platform prefixes across isolated tenants")."""
    prefixes = state.shared_prefixes
    if tok is None and prefixes.needs_tokenizer(model):
        tok = await tokenizer_for(state, head)
    match = prefixes.match(model, ids, page_size, tok)
    if match is None:
        return []
    if state.aliases.record(namespace, first, salt, match, page_size) \
            and state.view.writes is not None:  # the worker may ask another router
        state.view.writes.alias_recorded(state.aliases, namespace, first)
    state.totals["shared_prefix_requests"] += 1
    return prefixes.canonical_keys(match, page_size)


def _positive(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)
