"""Platform prefixes shared across isolated tenants, and the pool aliases that share them
(``docs/interfaces.md`` section 15; the pure rule is ``radix_global/aliases.py``).

- :class:`SharedPrefixes`: the registered prefixes, per served model, from the tenants file
  (``[shared_prefixes.<name>]``) and the admin API. A prefix is token ids, a text, or chat
  messages; the last two are tokenized on first use with the model's tokenizer.
- :meth:`SharedPrefixes.match`: the boundary of one request, the router's decision alone.
- :class:`AliasBook`: what the router remembers of the eligible requests it forwarded, so that a
  worker's pool backend can ask which of its salted keys are a prefix's canonical pages.

File::

    [shared_prefixes.support-agent]
    model = "tiny"
    text = "You are the support agent of ..."   # or token_ids = [...], or messages = [...]
"""

from __future__ import annotations

import collections
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from radix_global.aliases import AliasPair, alias_pairs, shared_pages
from radix_global.keys import page_keys, storage_page_key
from radix_global.types import Namespace, PageKey, PoolPageKey

log = logging.getLogger("radix_global.router.tenants")

MAX_PREFIXES = 256
MAX_PREFIX_TOKENS = 65536
MAX_ALIAS_HEADS = 65536
MAX_ENTRIES_PER_HEAD = 8
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SOURCES = ("token_ids", "text", "messages")


class SharedPrefixError(ValueError):
    """A bad shared-prefix definition (HTTP 400, or a refused tenants file)."""


class SharedPrefixExists(SharedPrefixError):
    """A prefix of that name is registered already (HTTP 409)."""


class Encoder(Protocol):
    """What a prefix needs of the model's tokenizer (``router.keying.tokenize.ModelTokenizer``)."""

    def encode_text(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: list[Any], tools: Any = None,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]: ...


class PrefixSpec(NamedTuple):
    """A registered prefix as the platform gave it: exactly one of the three sources."""

    name: str
    model: str
    token_ids: tuple[int, ...] | None = None
    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "model": self.model}
        if self.token_ids is not None:
            out["token_ids"] = list(self.token_ids)
        if self.text is not None:
            out["text"] = self.text
        if self.messages is not None:
            out["messages"] = list(self.messages)
        return out


def parse_spec(name: object, spec: object) -> PrefixSpec:
    """One definition from the tenants file or an admin request; :class:`SharedPrefixError`
    names what is wrong."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SharedPrefixError(f"shared prefix name {name!r} must be 1-64 characters of "
                                "A-Z a-z 0-9 . _ -")
    if not isinstance(spec, dict):
        raise SharedPrefixError(f"shared prefix {name!r} must be a table")
    unknown = set(spec) - {"name", "model", *_SOURCES}
    if unknown:
        raise SharedPrefixError(f"shared prefix {name!r}: unknown fields {sorted(unknown)}")
    if spec.get("name", name) != name:
        raise SharedPrefixError(f"shared prefix {name!r} says its name is {spec['name']!r}")
    model = spec.get("model")
    if not isinstance(model, str) or not model:
        raise SharedPrefixError(f"shared prefix {name!r} needs model = '<served model name>'")
    given = [s for s in _SOURCES if spec.get(s) is not None]
    if len(given) != 1:
        raise SharedPrefixError(f"shared prefix {name!r} needs exactly one of "
                                f"{', '.join(_SOURCES)}")
    ids, text, messages = spec.get("token_ids"), spec.get("text"), spec.get("messages")
    if ids is not None:
        if (not isinstance(ids, list) or not ids or len(ids) > MAX_PREFIX_TOKENS
                or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**63
                           for t in ids)):
            raise SharedPrefixError(f"shared prefix {name!r}: token_ids must be 1-"
                                    f"{MAX_PREFIX_TOKENS} non-negative integers")
        return PrefixSpec(name, model, token_ids=tuple(ids))
    if text is not None:
        if not isinstance(text, str) or not text:
            raise SharedPrefixError(f"shared prefix {name!r}: text must be a non-empty string")
        return PrefixSpec(name, model, text=text)
    if (not isinstance(messages, list) or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
        raise SharedPrefixError(f"shared prefix {name!r}: messages must be a non-empty list of "
                                "objects with a 'role'")
    return PrefixSpec(name, model, messages=tuple(messages))


def specs_from_mapping(table: object) -> list[PrefixSpec]:
    """The ``[shared_prefixes]`` table of a tenants file (absent: none)."""
    if table is None:
        return []
    if not isinstance(table, dict):
        raise SharedPrefixError("shared_prefixes must be a table of name -> {model, ...}")
    return [parse_spec(name, spec) for name, spec in table.items()]


class SharedMatch(NamedTuple):
    """A request's shared part: ``pages`` full pages equal to the start of ``tokens``."""

    name: str
    tokens: tuple[int, ...]  # the prefix's tokens (all of them, not only the matched pages)
    pages: int


class SharedPrefixes:
    """The registered prefixes. Not thread-safe: the router's event loop owns it."""

    def __init__(self, specs: Iterable[PrefixSpec] = (), share_past_prefix: bool = False) -> None:
        self._specs: dict[str, PrefixSpec] = {}
        self._tokens: dict[str, tuple[int, ...] | None] = {}  # name -> tokens (None: unusable)
        self._canonical: dict[tuple[str, int], list[PageKey]] = {}  # (name, page size) -> keys
        # The negative control of the isolation test only (docs/interfaces.md s. 15).
        self.share_past_prefix = share_past_prefix
        for spec in specs:
            self.add(spec)

    def __len__(self) -> int:
        return len(self._specs)

    def specs(self) -> list[PrefixSpec]:
        return sorted(self._specs.values())

    def add(self, spec: PrefixSpec) -> None:
        if spec.name in self._specs:
            raise SharedPrefixExists(f"shared prefix {spec.name!r} exists (DELETE it first)")
        if len(self._specs) >= MAX_PREFIXES:
            raise SharedPrefixError(f"at most {MAX_PREFIXES} shared prefixes")
        self._specs[spec.name] = spec
        if spec.token_ids is not None:
            self._tokens[spec.name] = spec.token_ids

    def remove(self, name: str) -> bool:
        self._tokens.pop(name, None)
        self._canonical = {k: v for k, v in self._canonical.items() if k[0] != name}
        return self._specs.pop(name, None) is not None

    def needs_tokenizer(self, model: str) -> bool:
        """Whether a prefix of ``model`` still waits to be tokenized."""
        return any(s.model == model and s.name not in self._tokens for s in self._specs.values())

    def _resolved(self, model: str, encoder: Encoder | None) -> list[tuple[str, tuple[int, ...]]]:
        out = []
        for spec in self._specs.values():
            if spec.model != model:
                continue
            if spec.name not in self._tokens and encoder is not None:
                self._tokens[spec.name] = _tokenize(spec, encoder)
            tokens = self._tokens.get(spec.name)
            if tokens:
                out.append((spec.name, tokens))
        return out

    def match(self, model: str, tokens: Sequence[int], page_size: int,
              encoder: Encoder | None = None) -> SharedMatch | None:
        """The longest run of full pages of ``tokens`` that starts one of ``model``'s prefixes;
        None when no page does. ``encoder`` tokenizes text and messages prefixes."""
        if len(tokens) < page_size:
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
        and page size, not per request."""
        if self.share_past_prefix:  # the shared part is the request itself
            return page_keys(match.tokens[: match.pages * page_size], page_size)
        keys = self._canonical.get((match.name, page_size))
        if keys is None:
            keys = self._canonical[(match.name, page_size)] = page_keys(match.tokens, page_size)
        return keys[: match.pages]


def _tokenize(spec: PrefixSpec, encoder: Encoder) -> tuple[int, ...] | None:
    try:
        if spec.text is not None:
            ids = encoder.encode_text(spec.text)
        else:
            ids = encoder.encode_chat(list(spec.messages or ()))
    except Exception as exc:  # a template that refuses the messages, a broken tokenizer
        log.warning("shared prefix %s of %s cannot be tokenized, not shared: %s",
                    spec.name, spec.model, exc)
        return None
    if not ids or len(ids) > MAX_PREFIX_TOKENS:
        log.warning("shared prefix %s of %s has %d tokens (1-%d allowed), not shared",
                    spec.name, spec.model, len(ids), MAX_PREFIX_TOKENS)
        return None
    return tuple(ids)


class _Entry(NamedTuple):
    name: str  # the registered prefix
    salt: str
    tokens: tuple[int, ...]  # the shared part's tokens: pairs cover its full pages
    page_size: int


class AliasBook:
    """``(namespace, salted head) -> (salt, shared tokens)`` of the eligible requests this router
    forwarded, bounded (LRU over heads, a few entries each); :meth:`pairs` recomputes the
    aliases on demand, so memory is a few references per head."""

    def __init__(self, max_heads: int = MAX_ALIAS_HEADS) -> None:
        self.max_heads = max_heads
        self._heads: collections.OrderedDict[tuple[Namespace, PageKey], list[_Entry]] = (
            collections.OrderedDict())
        self._pairs: dict[_Entry, list[AliasPair]] = {}  # computed once per entry

    def __len__(self) -> int:
        return len(self._heads)

    def record(self, namespace: Namespace, head: PageKey, salt: str, match: SharedMatch,
               page_size: int) -> None:
        key = (namespace, head)
        entries = self._heads.get(key)
        if entries is None:
            entries = self._heads[key] = []
            while len(self._heads) > self.max_heads:
                for gone in self._heads.popitem(last=False)[1]:
                    self._pairs.pop(gone, None)
        else:
            self._heads.move_to_end(key)
        entry = _Entry(match.name, salt, match.tokens, page_size)
        if entry in entries:
            return
        entries.append(entry)
        if len(entries) > MAX_ENTRIES_PER_HEAD:
            self._pairs.pop(entries.pop(0), None)

    def forget(self, name: str) -> None:
        """A prefix was unregistered: no worker is told its aliases any more (a backend keeps
        an answer for its time to live, docs/interfaces.md s. 15)."""
        for key in list(self._heads):
            kept = [e for e in self._heads[key] if e.name != name]
            for gone in set(self._heads[key]) - set(kept):
                self._pairs.pop(gone, None)
            if kept:
                self._heads[key] = kept
            else:
                del self._heads[key]

    def pairs(self, namespace: Namespace, head: PoolPageKey) -> list[AliasPair]:
        """Every alias of the chains recorded under ``head`` (the chain's first storage key),
        head first; none for an unknown head."""
        out: dict[str, AliasPair] = {}
        for e in self._heads.get((namespace, storage_page_key(head)), ()):
            pairs = self._pairs.get(e)
            if pairs is None:
                pairs = self._pairs[e] = alias_pairs(e.tokens, e.page_size, e.salt)
            if pairs and pairs[0].salted == head:  # not another head with the same 64-bit key
                out.update((p.salted, p) for p in pairs)
        return list(out.values())
