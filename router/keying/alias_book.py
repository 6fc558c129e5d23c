"""What the router remembers of the eligible requests it forwarded, so that a worker's pool
backend can ask which of its salted keys are a shared prefix's canonical pages
(``docs/interfaces.md`` section "Shared platform prefixes across isolated tenants"; the pure rule is
``radix_global/aliases.py``, the match that is recorded ``router/keying/shared_prefixes.py``)."""

from __future__ import annotations

import collections
from typing import NamedTuple

from radix_global.aliases import AliasPair, alias_pairs
from radix_global.keys import storage_page_key
from radix_global.types import Namespace, PageKey, PoolPageKey
from router.keying.shared_prefixes import SharedMatch

MAX_ALIAS_HEADS = 65536
MAX_ENTRIES_PER_HEAD = 8


class AliasEntry(NamedTuple):
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
        self._heads: collections.OrderedDict[tuple[Namespace, PageKey], list[AliasEntry]] = (
            collections.OrderedDict())
        self._pairs: dict[AliasEntry, list[AliasPair]] = {}  # computed once per entry

    def __len__(self) -> int:
        return len(self._heads)

    def record(self, namespace: Namespace, head: PageKey, salt: str, match: SharedMatch,
               page_size: int) -> bool:
        """Remember one forwarded request's match; True when it was not known yet."""
        return self.adopt(namespace, head, AliasEntry(match.name, salt, match.tokens, page_size))

    def adopt(self, namespace: Namespace, head: PageKey, entry: AliasEntry) -> bool:
        """Remember ``entry`` under ``head`` (one this or another router recorded); True when it
        was not known yet."""
        key = (namespace, head)
        entries = self._heads.get(key)
        if entries is None:
            entries = self._heads[key] = []
            while len(self._heads) > self.max_heads:
                for gone in self._heads.popitem(last=False)[1]:
                    self._pairs.pop(gone, None)
        else:
            self._heads.move_to_end(key)
        if entry in entries:
            return False
        entries.append(entry)
        if len(entries) > MAX_ENTRIES_PER_HEAD:
            self._pairs.pop(entries.pop(0), None)
        return True

    def entries(self, namespace: Namespace, head: PageKey) -> list[AliasEntry]:
        return list(self._heads.get((namespace, head), ()))

    def forget(self, name: str) -> None:
        """A prefix was unregistered: no worker is told its aliases any more (a backend keeps
        an answer for its time to live, docs/interfaces.md,
        "Shared platform prefixes across isolated tenants")."""
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
