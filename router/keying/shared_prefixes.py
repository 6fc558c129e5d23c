"""Platform prefixes shared across isolated tenants (``docs/interfaces.md`` section
"Shared platform prefixes across isolated tenants"; the pure rule is ``radix_global/aliases.py``).

- :class:`SharedPrefixes`: the registered prefixes, per served model, from the tenants file
  (``[shared_prefixes.<name>]``, parsed by ``router/keying/prefix_specs.py``) and the admin API.
  A prefix is token ids, a text, or chat messages; the last two are tokenized with the model's
  tokenizer on a background thread, never on the event loop: at registration when the model's
  tokenizer is known (:meth:`SharedPrefixes.register`, or a request of the model has brought
  it), else once the first eligible request brings it (that request is matched without the
  prefix). Sizes are bounded per prefix and in total (:data:`MAX_PREFIX_SOURCE_BYTES`,
  :data:`MAX_TOTAL_SOURCE_BYTES`, :data:`MAX_TOTAL_TOKENS`).
- :meth:`SharedPrefixes.match`: the boundary of one request, the router's decision alone; what
  the router remembers of the requests it matched is ``router/keying/alias_book.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

from radix_global.aliases import shared_pages
from radix_global.keys import page_keys
from radix_global.types import PageKey
from router.keying.prefix_specs import (
    MAX_PREFIX_TOKENS,
    PrefixSpec,
    SharedPrefixError,
    SharedPrefixExists,
)

log = logging.getLogger("radix_global.router.tenants")

MAX_PREFIXES = 256
# A text or messages prefix's own size (UTF-8 bytes; messages as JSON): the admin body's 1 MiB,
# also for the tenants file. Tokenizing is ~0.5 s a MiB on one core (issue 35: 16 prefixes of
# 1 MiB stalled the loop for 4 s when they were tokenized on it at the first request).
MAX_PREFIX_SOURCE_BYTES = 1 << 20
# All text and messages prefixes together (the 256 allowed could be 256 MiB of text to
# tokenize): 8 MiB, 32 full-size (65,536 tokens at ~4 bytes a token) text prefixes.
MAX_TOTAL_SOURCE_BYTES = 8 << 20
# All prefixes' tokens together (token ids given or tokenized): 2^21, 32 full-size prefixes.
# A token is a Python int in a tuple (~36 bytes): 256 full-size prefixes would hold ~600 MB.
MAX_TOTAL_TOKENS = 1 << 21


class Encoder(Protocol):
    """What a prefix needs of the model's tokenizer (``router.keying.tokenize.ModelTokenizer``)."""

    def encode_text(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: list[Any], tools: Any = None,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]: ...


class SharedMatch(NamedTuple):
    """A request's shared part: ``pages`` full pages equal to the start of ``tokens``."""

    name: str
    tokens: tuple[int, ...]  # the prefix's tokens (all of them, not only the matched pages)
    pages: int


class SharedPrefixes:
    """The registered prefixes. Not thread-safe: the router's event loop owns it; only the
    tokenization of text and messages prefixes runs on a thread of its own (one, so a burst of
    registrations takes one core), whose results the loop collects."""

    def __init__(self, specs: Iterable[PrefixSpec] = (), share_past_prefix: bool = False) -> None:
        self._specs: dict[str, PrefixSpec] = {}
        self._tokens: dict[str, tuple[int, ...] | None] = {}  # name -> tokens (None: unusable)
        self._problems: dict[str, str] = {}  # name -> why it is unusable
        self._canonical: dict[tuple[str, int], list[PageKey]] = {}  # (name, page size) -> keys
        # Tokenization off the loop: queued or running jobs, finished ones not yet collected,
        # and the last tokenizer a request brought per model (registrations after it are
        # tokenized at once).
        self._inflight: dict[str, Future[None]] = {}
        self._finished: list[tuple[PrefixSpec, tuple[int, ...] | None, str]] = []
        self._finished_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._encoders: dict[str, Encoder] = {}
        # The negative control of the isolation test only (docs/interfaces.md,
        # "Shared platform prefixes across isolated tenants").
        self.share_past_prefix = share_past_prefix
        for spec in specs:
            self.add(spec)

    def __len__(self) -> int:
        return len(self._specs)

    def specs(self) -> list[PrefixSpec]:
        return sorted(self._specs.values())

    def add(self, spec: PrefixSpec, encoder: Encoder | None = None) -> None:
        """Register ``spec``; :class:`SharedPrefixError` beyond the bounds. A text or messages
        prefix is tokenized off the loop at once when ``encoder`` (or one a request of the model
        brought) is known, else when the first eligible request brings one."""
        if spec.name in self._specs:
            raise SharedPrefixExists(f"shared prefix {spec.name!r} exists (DELETE it first)")
        if len(self._specs) >= MAX_PREFIXES:
            raise SharedPrefixError(f"at most {MAX_PREFIXES} shared prefixes")
        self._collect()
        if spec.token_ids is not None:
            total = self._total_tokens() + len(spec.token_ids)
            if total > MAX_TOTAL_TOKENS:
                raise SharedPrefixError(
                    f"shared prefix {spec.name!r}: {len(spec.token_ids)} more tokens would make "
                    f"{total}, over the {MAX_TOTAL_TOKENS} of all prefixes together")
        else:
            size = _source_bytes(spec)
            if size > MAX_PREFIX_SOURCE_BYTES:
                raise SharedPrefixError(f"shared prefix {spec.name!r}: {size} bytes of "
                                        f"{_source(spec)}, over {MAX_PREFIX_SOURCE_BYTES}")
            total = size + sum(_source_bytes(s) for s in self._specs.values()
                               if s.token_ids is None)
            if total > MAX_TOTAL_SOURCE_BYTES:
                raise SharedPrefixError(
                    f"shared prefix {spec.name!r}: {size} more bytes of text and messages would "
                    f"make {total}, over the {MAX_TOTAL_SOURCE_BYTES} of all prefixes together")
        self._specs[spec.name] = spec
        if spec.token_ids is not None:
            self._tokens[spec.name] = spec.token_ids
            return
        encoder = encoder or self._encoders.get(spec.model)
        if encoder is not None:
            self._submit(spec, encoder)

    async def register(self, spec: PrefixSpec, encoder: Encoder | None) -> None:
        """:meth:`add`, and with ``encoder`` wait for the tokenization (on its thread, not on
        the loop): a prefix that cannot be tokenized, has more than :data:`MAX_PREFIX_TOKENS`
        tokens or would pass :data:`MAX_TOTAL_TOKENS` is removed again and refused
        (:class:`SharedPrefixError`). Without ``encoder``: tokenized later (see :meth:`add`)."""
        self.add(spec, encoder)
        job = self._inflight.get(spec.name)
        if job is None:
            return
        # wait() rather than await: a DELETE meanwhile cancels the job, which is no error here
        await asyncio.wait([asyncio.wrap_future(job)])
        self._collect()
        if self._specs.get(spec.name) is not spec:  # a DELETE came while it was tokenized
            raise SharedPrefixError(f"shared prefix {spec.name!r} was deleted while it was "
                                    "tokenized")
        if self._tokens.get(spec.name, ()) is None:
            problem = self._problems.get(spec.name, "cannot be tokenized")
            self.remove(spec.name)
            raise SharedPrefixError(f"shared prefix {spec.name!r}: {problem}")

    def remove(self, name: str) -> bool:
        job = self._inflight.pop(name, None)
        if job is not None:
            job.cancel()  # not started yet: never runs; running: its result is dropped
        self._tokens.pop(name, None)
        self._problems.pop(name, None)
        self._canonical = {k: v for k, v in self._canonical.items() if k[0] != name}
        return self._specs.pop(name, None) is not None

    def needs_tokenizer(self, model: str) -> bool:
        """Whether a prefix of ``model`` waits for a tokenizer (not one already being
        tokenized)."""
        self._collect()
        return any(s.model == model and s.name not in self._tokens
                   and s.name not in self._inflight for s in self._specs.values())

    def pending(self, model: str | None = None) -> int:
        """Prefixes (of ``model``) not tokenized yet, queued or waiting for a tokenizer."""
        self._collect()
        return sum(1 for s in self._specs.values()
                   if (model is None or s.model == model) and s.name not in self._tokens)

    def _total_tokens(self) -> int:
        return sum(len(t) for t in self._tokens.values() if t)

    def _submit(self, spec: PrefixSpec, encoder: Encoder) -> None:
        if spec.name in self._inflight:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="shared-prefix-tokenize")
        self._inflight[spec.name] = self._executor.submit(self._tokenize_job, spec, encoder)

    def _tokenize_job(self, spec: PrefixSpec, encoder: Encoder) -> None:
        """On the tokenizing thread: hand the result to the loop (:meth:`_collect`)."""
        ids, problem = _tokenize(spec, encoder)
        with self._finished_lock:
            self._finished.append((spec, ids, problem))

    def _collect(self) -> None:
        """On the loop: take the finished tokenizations of prefixes still registered as they
        were (one removed, or removed and registered again, meanwhile is dropped)."""
        if not self._finished:
            return
        with self._finished_lock:
            done, self._finished = self._finished, []
        for spec, ids, problem in done:
            if self._specs.get(spec.name) is not spec or spec.name in self._tokens:
                continue
            self._inflight.pop(spec.name, None)
            if ids is not None and self._total_tokens() + len(ids) > MAX_TOTAL_TOKENS:
                problem = (f"its {len(ids)} tokens would pass the {MAX_TOTAL_TOKENS} of all "
                           "prefixes together")
                ids = None
            if ids is None:
                log.warning("shared prefix %s of %s is not shared: %s", spec.name, spec.model,
                            problem)
                self._problems[spec.name] = problem
            self._tokens[spec.name] = ids

    def _resolved(self, model: str, encoder: Encoder | None) -> list[tuple[str, tuple[int, ...]]]:
        self._collect()
        if encoder is not None:
            self._encoders[model] = encoder
        out = []
        for spec in self._specs.values():
            if spec.model != model:
                continue
            if spec.name not in self._tokens:
                # Never on the loop: this request goes on without the prefix, later ones of the
                # model match it once its thread has tokenized it.
                if encoder is not None:
                    self._submit(spec, encoder)
                continue
            tokens = self._tokens.get(spec.name)
            if tokens:
                out.append((spec.name, tokens))
        return out

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no tokenization is queued or running (tests, tools: never the loop);
        False on timeout."""
        jobs = list(self._inflight.values())
        try:
            for job in jobs:
                if not job.cancelled():
                    job.result(timeout)
        except TimeoutError:
            return False
        self._collect()
        return True

    def match(self, model: str, tokens: Sequence[int], page_size: int,
              encoder: Encoder | None = None) -> SharedMatch | None:
        """The longest run of full pages of ``tokens`` that starts one of ``model``'s prefixes;
        None when no page does. ``encoder`` tokenizes text and messages prefixes, on their
        thread: a prefix not tokenized yet does not match."""
        if len(tokens) < page_size:
            self._resolved(model, encoder)  # still start what waits for this tokenizer
            return None
        first = tuple(tokens[:page_size])  # only prefixes starting with this page can match
        best: SharedMatch | None = None
        for name, prefix in self._resolved(model, encoder):
            if prefix[:page_size] != first:
                continue
            pages = shared_pages(tokens, prefix, page_size)
            if pages and (best is None or pages > best.pages):
                best = SharedMatch(name, prefix, pages)
        if best is not None and self.share_past_prefix:
            return SharedMatch(best.name, tuple(tokens), len(tokens) // page_size)
        return best

    def canonical_keys(self, match: SharedMatch, page_size: int) -> list[PageKey]:
        """The canonical (unsalted) page keys of a match's shared pages: hashed once per prefix
        and page size, not per request, and only as far as a request has matched (hashing a
        65,536-token prefix whole at a short request's match would be the loop's work)."""
        if self.share_past_prefix:  # the shared part is the request itself
            return page_keys(match.tokens[: match.pages * page_size], page_size)
        keys = self._canonical.get((match.name, page_size))
        if keys is None or len(keys) < match.pages:
            keys = self._canonical[(match.name, page_size)] = page_keys(
                match.tokens[: match.pages * page_size], page_size)
        return keys[: match.pages]


def _source(spec: PrefixSpec) -> str:
    return "text" if spec.text is not None else "messages"


def _source_bytes(spec: PrefixSpec) -> int:
    if spec.text is not None:
        return len(spec.text.encode("utf-8", "surrogatepass"))
    if spec.messages is not None:
        return len(json.dumps(list(spec.messages), default=str).encode("utf-8", "surrogatepass"))
    return 0


def _tokenize(spec: PrefixSpec, encoder: Encoder) -> tuple[tuple[int, ...] | None, str]:
    """A text or messages prefix's tokens, or None and why not (on the tokenizing thread)."""
    try:
        if spec.text is not None:
            ids = encoder.encode_text(spec.text)
        else:
            ids = encoder.encode_chat(list(spec.messages or ()))
    except Exception as exc:  # a template that refuses the messages, a broken tokenizer
        return None, f"cannot be tokenized: {exc}"
    if not ids or len(ids) > MAX_PREFIX_TOKENS:
        return None, f"has {len(ids)} tokens (1-{MAX_PREFIX_TOKENS} allowed)"
    return tuple(ids), ""
