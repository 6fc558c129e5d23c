"""Token ids of the prompts the router routed, findable by their page keys (for warming).

The index knows page keys, not tokens: to send a hot prefix to another engine the router needs
its token ids, which only the prompts it routed carry (``router/cluster/warming.py``). The ids
alone are not enough: the same ids under another ``cache_salt`` or LoRA adapter are other pages,
so each prompt is remembered with the namespace it was keyed in (:class:`WarmScope`), and a warm
request carries exactly that (a tenant's prompt warmed without its salt would land in the shared
namespace: a leak, and useless to the tenant).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import NamedTuple

from radix_global.types import PageKey


class WarmScope(NamedTuple):
    """What besides the token ids keyed a prompt's pages, as the engine request names it."""

    cache_salt: str | None  # the salt the router decided (``router/keying/tenants.py``)
    lora: str | None  # the adapter's name (SGLang's ``lora_path`` on ``/generate``)


SHARED = WarmScope(None, None)


class Remembered(NamedTuple):
    ids: list[int]
    scope: WarmScope


class PrefixTokens:
    """Token ids of routed prompts, findable by any of their page keys. Pure; bounded LRU.

    Page keys are chained digests seeded by the salt and the adapter, so a key names its whole
    prefix and its scope: the ids of ``keys`` are the first ``len(keys) * page_size`` ids of a
    remembered prompt containing ``keys[-1]`` at position ``len(keys) - 1``, in that prompt's
    scope.
    """

    def __init__(self, max_pages: int = 200_000) -> None:
        if max_pages < 1:
            raise ValueError("max_pages must be >= 1")
        self.max_pages = max_pages
        self._prompts: collections.OrderedDict[
            int, tuple[str, tuple[PageKey, ...], list[int], int, WarmScope]] = \
            collections.OrderedDict()
        self._where: dict[tuple[str, PageKey], tuple[int, int]] = {}  # -> (prompt id, pages)
        self._pages = 0
        self._next = 0

    def remember(self, namespace: str, keys: Sequence[PageKey], ids: Sequence[int],
                 page_size: int, scope: WarmScope) -> None:
        """``keys``: the page keys of ``ids`` as keyed in ``scope``."""
        pages = min(len(keys), len(ids) // page_size) if page_size > 0 else 0
        if pages == 0 or pages > self.max_pages:
            return
        last = self._where.get((namespace, keys[pages - 1]))
        if last is not None and last[1] == pages:  # already known: refresh its prompt
            self._prompts.move_to_end(last[0])
            return
        pid = self._next
        self._next += 1
        own = tuple(keys[:pages])
        self._prompts[pid] = (namespace, own, list(ids[: pages * page_size]), page_size, scope)
        for i, key in enumerate(own):
            self._where[(namespace, key)] = (pid, i + 1)
        self._pages += pages
        while self._pages > self.max_pages:
            self._evict()

    def tokens(self, namespace: str, keys: Sequence[PageKey]) -> Remembered | None:
        """The ids of the prefix ``keys`` and the scope they were keyed in; None if unknown."""
        if not keys:
            return None
        hit = self._where.get((namespace, keys[-1]))
        if hit is None or hit[1] != len(keys):
            return None
        _, _, ids, page_size, scope = self._prompts[hit[0]]
        self._prompts.move_to_end(hit[0])
        return Remembered(ids[: len(keys) * page_size], scope)

    def _evict(self) -> None:
        pid, (namespace, keys, *_) = self._prompts.popitem(last=False)
        self._pages -= len(keys)
        for key in keys:
            if self._where.get((namespace, key), (None,))[0] == pid:
                del self._where[(namespace, key)]

    def __len__(self) -> int:
        return len(self._prompts)
