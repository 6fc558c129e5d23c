"""Shared-prefix aliases in the pool backend: a salted storage key of a registered platform
prefix is read from, and written to, the prefix's canonical key (``docs/interfaces.md`` s. 15).

The backend sees only storage keys, never tokens or salts, so it asks the router that decided
the request's boundary: ``GET {router}/admin/pool-aliases?namespace=NS&head=HEX`` for a chain
head it has not seen, and keeps the answer for ``ttl_s`` (an empty one for ``miss_ttl_s``).
A failed question is no alias: the engine recomputes. Thread-safe: SGLang calls the backend
from its prefetch and backup threads.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import httpx

from radix_global.keys import page_key
from radix_global.types import PageKey

log = logging.getLogger(__name__)

Fetch = Callable[[str], Sequence[Sequence[str]]]  # head -> [[salted, canonical], ...]
MAX_HEADS = 4096
MAX_PAIRS_PER_HEAD = 65536


class AliasUnavailable(Exception):
    """The router cannot answer alias questions at all (an endpoint it does not have)."""


def http_fetch(router_url: str, namespace: str, token: str | None, timeout_s: float = 0.5,
               transport: httpx.BaseTransport | None = None) -> Fetch:
    """The router's ``/admin/pool-aliases`` as a :data:`Fetch`."""
    client = httpx.Client(timeout=timeout_s, transport=transport,
                          headers={"Authorization": f"Bearer {token}"} if token else {})
    url = router_url.rstrip("/") + "/admin/pool-aliases"

    def fetch(head: str) -> Sequence[Sequence[str]]:
        resp = client.get(url, params={"namespace": namespace, "head": head})
        if resp.status_code in (404, 405):
            raise AliasUnavailable(f"{router_url} has no /admin/pool-aliases")
        resp.raise_for_status()
        pairs = resp.json().get("pairs")
        if not isinstance(pairs, list):
            raise ValueError("answer without a 'pairs' list")
        return pairs

    return fetch


class _Head(NamedTuple):
    expires: float
    salted: tuple[str, ...]  # this head's alias keys (empty: no alias)


def _tag(key: str) -> PageKey:
    return page_key(bytes.fromhex(key))


def _is_key(value: object) -> bool:
    try:
        return isinstance(value, str) and len(value) == 64 and bool(bytes.fromhex(value))
    except ValueError:
        return False


class AliasResolver:
    """Salted key -> canonical key, for the chain heads asked about, bounded (LRU heads)."""

    def __init__(self, fetch: Fetch, clock: Callable[[], float] = time.monotonic,
                 ttl_s: float = 60.0, miss_ttl_s: float = 5.0, max_heads: int = MAX_HEADS
                 ) -> None:
        self._fetch, self._clock = fetch, clock
        self.ttl_s, self.miss_ttl_s, self.max_heads = ttl_s, miss_ttl_s, max_heads
        self._lock = threading.Lock()
        self._heads: collections.OrderedDict[str, _Head] = collections.OrderedDict()
        self._canonical: dict[str, str] = {}  # salted -> canonical
        self._aliases: dict[PageKey, set[str]] = {}  # canonical page -> salted keys known here
        self._announced: set[str] = set()  # alias keys already published as pool pages
        self.disabled = False
        self.questions = 0
        self.failures = 0

    def learn(self, head: str) -> None:
        """Make sure the aliases of the chain starting at ``head`` are known (one question to
        the router at most per head and ``ttl_s``)."""
        if self.disabled:
            return
        now = self._clock()
        with self._lock:
            known = self._heads.get(head)
            if known is not None and known.expires > now:
                self._heads.move_to_end(head)
                return
        try:
            self.questions += 1
            pairs = self._fetch(head)
        except AliasUnavailable as exc:
            log.warning("radix-global: shared-prefix aliases off: %s", exc)
            self.disabled = True
            return
        except Exception as exc:  # the router is away or slow: no alias, the engine recomputes
            self.failures += 1
            if self.failures in (1, 10, 100) or self.failures % 1000 == 0:
                log.warning("radix-global: asking the router for pool aliases failed (%d so "
                            "far): %r", self.failures, exc)
            pairs = []
        good = [(s, c) for s, c in (p for p in pairs if len(p) == 2) if _is_key(s) and _is_key(c)]
        if good and good[0][0] != head:
            good = []  # an answer about another chain
        self._install(head, good[:MAX_PAIRS_PER_HEAD], now)

    def _install(self, head: str, pairs: list[tuple[str, str]], now: float) -> None:
        with self._lock:
            old = self._heads.pop(head, None)
            if old is not None:
                self._drop(old.salted)
            ttl = self.ttl_s if pairs else self.miss_ttl_s
            self._heads[head] = _Head(now + ttl, tuple(s for s, _ in pairs))
            for salted, canonical in pairs:
                self._canonical[salted] = canonical
                self._aliases.setdefault(_tag(canonical), set()).add(salted)
            while len(self._heads) > self.max_heads:
                _, evicted = self._heads.popitem(last=False)
                self._drop(evicted.salted)

    def _drop(self, salted: Iterable[str]) -> None:
        for s in salted:
            canonical = self._canonical.pop(s, None)
            self._announced.discard(s)
            if canonical is not None:
                rest = self._aliases.get(_tag(canonical))
                if rest is not None:
                    rest.discard(s)
                    if not rest:
                        del self._aliases[_tag(canonical)]

    def canonical(self, key: str) -> str | None:
        """The canonical key ``key`` is an alias of (None: it is no alias)."""
        with self._lock:
            return self._canonical.get(key)

    def aliases_of(self, tag: PageKey) -> list[str]:
        """The alias keys this process knows of the canonical page ``tag``."""
        with self._lock:
            return sorted(self._aliases.get(tag, ()))

    def announce(self, salted: Sequence[str]) -> list[str]:
        """Of these alias keys, those not yet published as pool pages (marked published now)."""
        with self._lock:
            new = [s for s in salted if s in self._canonical and s not in self._announced]
            self._announced.update(new)
            return new

    def forget_announced(self, salted: Iterable[str]) -> None:
        """These alias keys left the pool (their canonical page went): publish them again later."""
        with self._lock:
            self._announced.difference_update(salted)
