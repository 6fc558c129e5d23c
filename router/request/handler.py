"""One front-end request, end to end: parse -> tokenize -> page keys -> route -> forward.

The body is decoded once, into the typed request of its endpoint
(``router/keying/request_body.py``). Refusals before any compute are raised where they are
decided (:class:`router.transport.errors.HttpError`, or a typed error of the keying step) and
answered once, in :func:`handle`, as 4xx/5xx JSON; a policy rejection is 429 with
``Retry-After``. The answer for a routed request is an ASGI response that forwards it:
:class:`router.request.relay.Forward` (retries on another worker when one refused the
connection, relays the answer, aborts the engine request when the client disconnects), or
:class:`router.request.pool_relay.PoolForward` for a pool PD hand-off.

What the router decides for the client, never the client itself: the engine request id
(``Inbound.req.request_id``; a client's ``rid`` is only a label), and the ``cache_salt``
(``router/keying/tenants.py``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NamedTuple

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp

from radix_global.keys import page_keys
from radix_global.types import Namespace, PageKey, Role
from router.cluster.prefix_tokens import WarmScope
from router.cluster.registry import WorkerEntry
from router.keying.lora import ModelRef, adapter_extra_key, resolve_model
from router.keying.prompt import prompt_token_ids
from router.keying.request_body import (
    BodyError,
    GenerateBody,
    RequestBody,
    RequestKind,
    decode_body,
    decode_object,
)
from router.keying.tenants import Tenant, TenantError, effective_salt
from router.keying.tokenize import ModelTokenizer, PromptError, model_vocab_size
from router.request.inbound import Inbound
from router.request.pool_relay import PoolForward
from router.request.relay import Forward
from router.request.route import prefetch_matches, route_when_released
from router.routing.contract import RouteRequest
from router.state import RouterState
from router.transport.errors import ErrorType, HttpError, error_response
from router.transport.proxy import ClientGone, forward_headers

log = logging.getLogger("radix_global.router.request")

# A prompt whose body is longer than this many bytes per token of the context cannot fit (no
# tokenizer's average token is that long, and a token id is at most 10 digits and a separator):
# refused before tokenizing, which would cost seconds of CPU for a body of megabytes, and before
# a held request keeps a body of junk in memory.
MAX_BYTES_PER_TOKEN = 32
BYTES_SLACK = 256 * 1024  # the rest of a body: sampling parameters, tool schemas, ...
THREAD_TOKENIZE_BYTES = 65536  # larger prompts are tokenized off the event loop


async def read_body(request: Request, limit: int, what: str = "request body") -> bytes:
    """The whole body; 413 when it is larger than ``limit`` (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, f"{what} larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"{what} larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


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


def _model_of(state: RouterState, model: str | None, kind: RequestKind) -> ModelRef:
    models = state.registry.models()
    ref = resolve_model(model, models) if model is not None else None  # <model>:<adapter>
    if ref is None and (model is None or kind is RequestKind.GENERATE) and len(models) == 1:
        ref = ModelRef(next(iter(models)), None)
    if ref is not None:
        return ref
    if not models:
        raise HttpError(503, "no healthy worker", ErrorType.UNAVAILABLE)
    if model is None:
        raise HttpError(400, f"'model' is required; served: {sorted(models)}")
    raise HttpError(404, f"unknown model {model[:200]!r}; served: {sorted(models)}",
                    ErrorType.MODEL_NOT_FOUND)


async def handle(state: RouterState, request: Request, kind: RequestKind, upstream_path: str
                 ) -> Response | ASGIApp:
    """Answer one inference request (any of the three front-end shapes): the ASGI app that
    forwards it, or the answer that refuses it. Every refusal on the way is raised where it is
    decided and answered here."""
    try:
        return await _accept(state, request, kind, upstream_path)
    except HttpError as exc:
        return exc.response()
    except TenantError as exc:
        return error_response(401, str(exc), ErrorType.AUTHENTICATION)
    except (BodyError, PromptError) as exc:
        return error_response(400, str(exc))
    except (ClientDisconnect, ClientGone):
        return Response(status_code=499)


async def _accept(state: RouterState, request: Request, kind: RequestKind, upstream_path: str
                  ) -> ASGIApp:
    cfg = state.config
    t0 = state.clock()
    headers = forward_headers(request.scope["headers"])
    tenant = state.tenants.resolve(headers.get("authorization"))  # before the body
    raw = await read_body(request, cfg.client.max_body_bytes)
    body = decode_body(kind, raw)
    ref = _model_of(state, body.model, kind)
    entries = state.registry.for_model(ref.model)
    if not any(e.accepting for e in entries):
        raise HttpError(503, f"no healthy worker for model {ref.model!r}", ErrorType.UNAVAILABLE)
    # Read before the awaits below (a worker may leave meanwhile); one model, one namespace.
    keyed = await _keyed(state, entries[0], body, len(raw), ref, tenant)
    req = keyed.req
    rewritten = body.sets_engine_field or state.pd_pool is not None \
        or any(e.info.role is Role.DECODE for e in entries)
    inbound = Inbound(req, body, raw, keyed.scope.cache_salt, kind, upstream_path, ref.model,
                      headers, t0,
                      decode_object(raw) if rewritten else None)
    await prefetch_matches(state, req)
    if state.pd_pool is not None:  # prefill/decode hand-off through the L3 pool (docs/pd.md)
        await state.pd_pool.learn_capacity(entries)
    first = await route_when_released(state, inbound, request.scope, request.receive)
    if state.warmer.enabled and keyed.ids:  # token ids of reused prefixes, for warming
        state.warmer.remember(req.namespace, req.page_keys, keyed.ids, req.page_size,
                              first.decision.prefix_tokens, keyed.scope)
    if state.pd_pool is not None and first.decision.decode_worker_id is not None:
        return PoolForward(state, state.pd_pool, inbound, first)
    return Forward(state, inbound, first)


class Keyed(NamedTuple):
    req: RouteRequest  # what the routing core sees
    ids: list[int] | None  # the prompt's token ids (None: not tokenized)
    scope: WarmScope  # the salt and adapter that keyed them


async def _keyed(state: RouterState, head: WorkerEntry, body: RequestBody, size: int,
                 ref: ModelRef, tenant: Tenant) -> Keyed:
    """The request as the routing core sees it: token ids -> page keys in the namespace of
    ``head``'s pool (and that namespace as an engine request names it: the salt the router
    decides for ``tenant`` and the adapter). ``size``: the body's length in bytes."""
    clock, cfg = state.clock, state.config
    t_tok = clock()
    namespace = Namespace(head.info.namespace)
    salt = effective_salt(tenant, body.cache_salt if isinstance(body.cache_salt, str) else None)
    context = cfg.models.context_length or head.context_length
    if context is not None and size > context * MAX_BYTES_PER_TOKEN + BYTES_SLACK:
        raise HttpError(400, f"request body of {size} bytes cannot fit the model's context "
                        f"length of {context} tokens", ErrorType.CONTEXT_LENGTH)
    # Token-id prompts never wait for the tokenizer (it may still be loading).
    tok = await tokenizer_for(state, head) if body.needs_tokenizer else None
    path = cfg.models.model_path or head.model_path
    vocab = model_vocab_size(path) if path else None
    ids = await asyncio.to_thread(prompt_token_ids, body, tok, vocab) \
        if tok is not None and size > THREAD_TOKENIZE_BYTES \
        else prompt_token_ids(body, tok, vocab)
    if ids is None:
        state.totals["untokenized"] += 1
    if ids is not None and context is not None and len(ids) >= context:
        raise HttpError(400, f"prompt has {len(ids)} tokens; the model's context length is "
                        f"{context}", ErrorType.CONTEXT_LENGTH)
    page_size = state.registry.page_size(namespace) or head.info.page_size
    # SGLang reads "<model>:<adapter>" on its OpenAI endpoints only; /generate has lora_path.
    adapter = body.adapter(ref.adapter if not isinstance(body, GenerateBody) else None)
    extra_key = adapter_extra_key(adapter, head.lora, state.lora_extra_keys)  # worker's first
    keys = page_keys(ids, page_size, cache_salt=salt, extra_key=extra_key) if ids else []
    shared: list[PageKey] = []
    if ids and keys and salt and extra_key is None and len(state.shared_prefixes):
        shared = await _shared_keys(state, head, ref.model, namespace, ids, page_size, salt,
                                    keys[0], tok)
    state.metrics.stage("tokenize").observe(clock() - t_tok)
    req = RouteRequest(
        request_id=state.request_ids.new(), namespace=namespace,
        input_tokens=len(ids) if ids else 0, page_keys=keys, page_size=page_size,
        tenant=tenant.name, ttft_slo_s=body.ttft_slo_s, output_tokens_hint=body.output_tokens_hint,
        shared_keys=shared, streams=body.stream_requested)
    return Keyed(req, ids, WarmScope(salt, adapter))


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

