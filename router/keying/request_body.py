"""The client's JSON body, decoded once at the edge into a typed request per endpoint.

Three shapes: SGLang ``/generate`` (:class:`GenerateBody`: ``text`` or ``input_ids``), OpenAI
completions (:class:`CompletionBody`: ``prompt``, text or token ids, or a batch of either) and
OpenAI chat (:class:`ChatBody`: ``messages``). Each struct holds only the fields the router
reads (keying, tenants, LoRA, the hints, the SLO), with their bounds; a body that breaks them is
a :class:`BodyError` (HTTP 400) naming the field. Every other field is the engine's: it stays in
the raw bytes, which are forwarded as sent (``router/transport/bodies.py`` splices the router's
own fields in front), so a field this module does not know passes through unchanged.

A batch request is routed by its first prompt (the whole batch goes to one worker).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from router.keying.tenants import CLIENT_SALT_MAX_CHARS

CLIENT_RID_MAX_CHARS = 256
MAX_BATCH = 4096  # prompts in one batch request

Tokens = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(gt=0)]  # finite: JSON has no infinity, 1e999 is out of range


# The fields the router may set in an engine's body (``router/request/inbound.py``).
ENGINE_FIELDS = ("rid", "request_id", "cache_salt", "routed_dp_rank")


class RequestKind(StrEnum):
    """Which front-end endpoint a request came in on."""

    CHAT = "chat"
    COMPLETION = "completion"
    GENERATE = "generate"


class BodyError(ValueError):
    """A request body the router will not take (HTTP 400); the message names the field."""


class RequestBody(msgspec.Struct, kw_only=True, frozen=True):
    """What every endpoint's body has that the router reads.

    ``rid``, ``request_id``, ``cache_salt`` and ``routed_dp_rank`` are the fields the router may
    set in the engine's body; they default to ``UNSET`` so that one the client sent, even as
    ``null``, is known to be there (replaced, not added twice). Subclasses say where the prompt
    is (:meth:`prompt_field`)."""

    model: str | None = None
    stream: bool | None = None
    rid: str | list[str] | UnsetType | None = UNSET
    request_id: Any = UNSET
    cache_salt: Annotated[str, Meta(max_length=CLIENT_SALT_MAX_CHARS)] | UnsetType | None = UNSET
    routed_dp_rank: Any = UNSET
    lora_path: str | list[str | None] | None = None
    ttft_slo_s: Seconds | None = None

    def __post_init__(self) -> None:
        prompt = self.prompt_field()
        batch = _batch_of(prompt)
        if batch is not None:
            if batch > MAX_BATCH:
                raise BodyError(f"a batch of {batch} prompts is more than {MAX_BATCH}")
            shape = type(prompt[0])
            if not all(isinstance(p, shape) for p in prompt):
                raise BodyError("a batch of prompts must be all strings or all token-id lists")
        if isinstance(self.rid, list) and len(self.rid) != (batch or 1):
            raise BodyError("'rid' must be one string per prompt of the batch")
        label = self.client_rid
        if label is not None and (not label or len(label) > CLIENT_RID_MAX_CHARS
                                  or not label.isprintable()):
            raise BodyError(f"'rid' must be 1 to {CLIENT_RID_MAX_CHARS} printable characters")

    def prompt_field(self) -> Any:
        """The prompt field as sent: one prompt or a batch (None: not a list-shaped prompt)."""
        return None

    @property
    def batch(self) -> int | None:
        """How many prompts a batch request carries (None: one prompt, not a batch)."""
        return _batch_of(self.prompt_field())

    @property
    def needs_tokenizer(self) -> bool:
        """False when the (first) prompt already is token ids."""
        return True

    @property
    def output_tokens_hint(self) -> int | None:
        """The most output tokens the client asked for (None: it did not say)."""
        return None

    @property
    def stream_requested(self) -> bool:
        return self.stream is True

    @property
    def client_rid(self) -> str | None:
        """The client's own ``rid`` (a batch's first): a label in the router's records, never
        sent to an engine."""
        rid = self.rid[0] if isinstance(self.rid, list) else self.rid
        return rid if isinstance(rid, str) else None

    def adapter(self, from_model: str | None) -> str | None:
        """The LoRA adapter of the (first) prompt: ``from_model`` (the ``<model>:<adapter>``
        suffix, which wins), else ``lora_path``."""
        if from_model is not None:
            return from_model
        value = self.lora_path[0] if isinstance(self.lora_path, list) and self.lora_path \
            else self.lora_path
        return value if isinstance(value, str) and value else None

    def has(self, field: str) -> bool:
        """Whether the client sent ``field``, one the router may set, even as ``null`` (a name
        this struct does not hold is an ``AttributeError``: the router cannot tell, so it must
        not set it)."""
        return getattr(self, field) is not UNSET

    @property
    def sets_engine_field(self) -> bool:
        """Whether the client sent a field the router may set (its body is then rewritten)."""
        return any(self.has(k) for k in ENGINE_FIELDS)


def _batch_of(prompt: object) -> int | None:
    """The number of prompts of a list of prompts (strings or token-id lists), None for one
    prompt (a string or one token-id list). Its shape was checked when it was decoded."""
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[0], str | list):
        return None
    return len(prompt)


def _lax_true(value: Any) -> bool:
    """True as the engines' pydantic reads a bool: ``true``, ``1`` and ``"true"`` alike."""
    return value in (True, 1, "true", "True")


def first_prompt(prompt: Any) -> Any:
    """The first prompt of a batch, or the prompt itself."""
    return prompt[0] if _batch_of(prompt) is not None else prompt


class SamplingParams(msgspec.Struct, kw_only=True, frozen=True):
    max_new_tokens: Tokens | None = None


class GenerateBody(RequestBody, kw_only=True, frozen=True):
    """SGLang ``/generate``: ``text`` or ``input_ids`` (either may be a batch)."""

    text: str | list[str] | None = None
    input_ids: list[Any] | None = None
    sampling_params: SamplingParams | list[SamplingParams] | None = None

    def __post_init__(self) -> None:
        if self.input_ids is None and not self.text:
            raise BodyError("/generate needs 'text' (a string, or a non-empty list of them) or "
                            "'input_ids' (a list of ints, or a list of such lists)")
        if self.input_ids and isinstance(self.input_ids[0], str):
            raise BodyError("'input_ids' must be token ids (ints), not strings")
        super().__post_init__()

    def prompt_field(self) -> Any:
        return self.input_ids if self.input_ids is not None else self.text

    @property
    def needs_tokenizer(self) -> bool:
        return self.input_ids is None

    @property
    def output_tokens_hint(self) -> int | None:
        params = self.sampling_params
        if isinstance(params, list):
            params = params[0] if params else None
        return params.max_new_tokens if params is not None else None


class OpenAiBody(RequestBody, kw_only=True, frozen=True):
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None
    # the router asks a stream for its usage chunk (``engine_stream_options``) and SGLang for
    # its cached tokens by tier (``return_cached_tokens_details``)
    stream_options: dict[str, Any] | UnsetType | None = UNSET
    return_cached_tokens_details: Any = UNSET

    @property
    def output_tokens_hint(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def usage_requested(self) -> bool:
        """Whether the client asked a stream for its usage chunk (``include_usage``)."""
        return isinstance(self.stream_options, dict) and \
            _lax_true(self.stream_options.get("include_usage"))

    @property
    def sets_engine_field(self) -> bool:
        return super().sets_engine_field or self.stream_options is not UNSET or \
            self.return_cached_tokens_details is not UNSET

    @property
    def details_requested(self) -> bool:
        """Whether the client asked SGLang for ``sglext.cached_tokens_details`` itself."""
        return _lax_true(self.return_cached_tokens_details)

    def engine_stream_options(self) -> dict[str, Any] | None:
        """The ``stream_options`` the engine gets: the client's, with ``include_usage``, so
        that the router reads the engine's cached tokens from the last chunk (None: not a
        stream, or the client asked for usage itself)."""
        if not self.stream_requested or self.usage_requested:
            return None
        return {**(self.stream_options or {}), "include_usage": True}


class CompletionBody(OpenAiBody, kw_only=True, frozen=True):
    """OpenAI completions: ``prompt`` is text, token ids, or a batch of either."""

    prompt: str | list[Any]

    def __post_init__(self) -> None:
        if isinstance(self.prompt, list) and not self.prompt:
            raise BodyError("'prompt' must not be empty")
        super().__post_init__()

    def prompt_field(self) -> Any:
        return self.prompt

    @property
    def needs_tokenizer(self) -> bool:
        return not isinstance(first_prompt(self.prompt), list)


class ChatBody(OpenAiBody, kw_only=True, frozen=True):
    """OpenAI chat: ``messages`` (objects with a ``role``, passed whole to the chat template),
    with the ``tools`` and template arguments the template reads."""

    messages: Annotated[list[dict[str, Any]], Meta(min_length=1)]
    tools: list[Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not all(isinstance(m.get("role"), str) for m in self.messages):
            raise BodyError("each message must be an object with a 'role'")
        super().__post_init__()


# Lax, as the engines' pydantic models are: 100.0 is an int, "true" a bool; 100.5 is no int.
_DECODERS: dict[RequestKind, msgspec.json.Decoder[RequestBody]] = {
    RequestKind.GENERATE: msgspec.json.Decoder(GenerateBody, strict=False),
    RequestKind.COMPLETION: msgspec.json.Decoder(CompletionBody, strict=False),
    RequestKind.CHAT: msgspec.json.Decoder(ChatBody, strict=False)}


def decode_object(raw: bytes) -> dict[str, Any]:
    """``raw`` whole, as a dict, for a body the router rewrites. :class:`BodyError` for what the
    typed decode let through because it only skipped it (a number out of range in a field the
    router does not read, say)."""
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise BodyError(f"invalid request: {exc}") from None
    except RecursionError:
        raise BodyError("JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise BodyError("request body must be a JSON object")
    return obj


def decode_body(kind: RequestKind, raw: bytes) -> RequestBody:
    """``raw`` as the typed request of endpoint ``kind``; :class:`BodyError` when it is not
    JSON, not an object, or breaks a field's type or bound."""
    try:
        return _DECODERS[kind].decode(raw)
    except msgspec.ValidationError as exc:
        if raw.lstrip()[:1] != b"{":
            raise BodyError("request body must be a JSON object") from None
        raise BodyError(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BodyError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise BodyError("JSON nested too deeply") from None
