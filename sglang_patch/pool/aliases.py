"""Shared-prefix aliases in the pool backend: a salted storage key of a registered platform
prefix is read from, and written to, the prefix's canonical key (``docs/interfaces.md``,
"Shared platform prefixes across isolated tenants").

The backend sees only storage keys, never tokens or salts, so it asks the router that decided
the request's boundary: ``GET {router}/admin/pool-aliases?namespace=NS&head=HEX`` for a chain
head it has not seen, and keeps the answer for ``ttl_s`` (an empty one for ``miss_ttl_s``).
A failed question is no alias: the engine recomputes, and the resolver backs off (1 s doubling
to 60 s); a router with no prefix registered is not asked for ``idle_s``; one without the
endpoint for ``reprobe_s``. Thread-safe: SGLang calls the backend from its prefetch and backup
threads.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import httpx

from radix_global.keys import storage_page_key
from radix_global.types import PageKey
from sglang_patch.register import first_answer, router_urls

log = logging.getLogger(__name__)

Fetch = Callable[[str], Any]  # head -> the router's JSON answer: {"pairs": [...], "prefixes": n}
MAX_HEADS = 4096
MAX_MISSES = 65536
MAX_KNOWN_ALIASES = 1 << 20
MAX_PAIRS_PER_HEAD = 65536


class AliasUnavailable(Exception):
    """The router cannot answer alias questions at all (an endpoint it does not have)."""


def http_fetch(router_url: str, namespace: str, token: str | None, timeout_s: float = 0.5,
               transport: httpx.BaseTransport | None = None) -> Fetch:
    """The router's ``/admin/pool-aliases`` as a :data:`Fetch` (several routers sharing one
    view, comma-separated: the first that answers)."""
    client = httpx.Client(timeout=timeout_s, transport=transport,
                          headers={"Authorization": f"Bearer {token}"} if token else {})
    urls = [u + "/admin/pool-aliases" for u in router_urls(router_url)]

    def fetch(head: str) -> Any:
        resp = first_answer(urls, lambda url: client.get(
            url, params={"namespace": namespace, "head": head}))
        if resp.status_code in (404, 405):
            raise AliasUnavailable(f"{router_url} has no /admin/pool-aliases")
        resp.raise_for_status()
        return resp.json()

    return fetch


class _Head(NamedTuple):
    expires: float
    salted: tuple[str, ...]  # this head's alias keys


def _is_key(value: object) -> bool:
    try:
        return isinstance(value, str) and len(value) == 64 and bool(bytes.fromhex(value))
    except ValueError:
        return False


def _pairs(answer: Any, head: str) -> tuple[list[tuple[str, str]], int | None]:
    """The well-formed pairs of an answer about ``head`` (none if it is about another chain),
    and how many prefixes the router has registered (None: it did not say)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("pairs"), list):
        raise ValueError(f"not an alias answer: {str(answer)[:100]}")
    good = [(p[0], p[1]) for p in answer["pairs"]
            if isinstance(p, list) and len(p) == 2 and _is_key(p[0]) and _is_key(p[1])]
    if good and good[0][0] != head:
        good = []
    count = answer.get("prefixes")
    return good[:MAX_PAIRS_PER_HEAD], count if isinstance(count, int) else None


class AliasResolver:
    """Salted key -> canonical key, for the chain heads asked about, bounded (LRU heads; the
    alias keys known of each canonical page outlive their head, so an eviction still names
    them)."""

    def __init__(self, fetch: Fetch, clock: Callable[[], float] = time.monotonic,
                 ttl_s: float = 60.0, miss_ttl_s: float = 5.0, max_heads: int = MAX_HEADS,
                 idle_s: float = 2.0, reprobe_s: float = 300.0, max_backoff_s: float = 60.0
                 ) -> None:
        self._fetch, self._clock = fetch, clock
        self.ttl_s, self.miss_ttl_s, self.max_heads = ttl_s, miss_ttl_s, max_heads
        self.idle_s, self.reprobe_s, self.max_backoff_s = idle_s, reprobe_s, max_backoff_s
        self._lock = threading.Lock()
        self._heads: collections.OrderedDict[str, _Head] = collections.OrderedDict()
        self._misses: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._canonical: dict[str, str] = {}  # salted -> canonical, for the heads kept
        # canonical page -> the alias keys known here (FIFO-bounded)
        self._aliases: collections.OrderedDict[PageKey, set[str]] = collections.OrderedDict()
        self._announced: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._quiet_until = 0.0  # no questions before (router away, no prefixes, no endpoint)
        self._backoff_s = 0.0
        self.questions = 0
        self.failures = 0

    @property
    def quiet(self) -> bool:
        return self._clock() < self._quiet_until

    def learn(self, head: str) -> None:
        """Make sure the aliases of the chain starting at ``head`` are known: at most one
        question to the router per head and ``ttl_s`` (``miss_ttl_s`` for a chain without
        aliases), none while the router has no prefixes, is away (backing off) or has no
        such endpoint."""
        now = self._clock()
        with self._lock:
            if now < self._quiet_until:
                return
            known = self._heads.get(head)
            if known is not None and known.expires > now:
                self._heads.move_to_end(head)
                return
            missed = self._misses.get(head)
            if missed is not None and missed > now:
                return
            self.questions += 1
        try:
            pairs, prefixes = _pairs(self._fetch(head), head)
        except AliasUnavailable as exc:
            self._quiet(now, self.reprobe_s, f"shared-prefix aliases off for "
                                             f"{self.reprobe_s:.0f} s: {exc}")
            return
        except Exception as exc:  # the router is away, slow or confused: the engine recomputes
            with self._lock:
                self.failures += 1
                self._backoff_s = min(self.max_backoff_s, max(1.0, 2 * self._backoff_s))
                backoff = self._backoff_s
            self._quiet(now, backoff, f"asking the router for pool aliases failed "
                                      f"({self.failures} so far), next try in {backoff:.0f} s: "
                                      f"{exc!r}")
            return
        with self._lock:
            self._backoff_s = 0.0
        if pairs:
            self._install(head, pairs, now)
        elif prefixes == 0:
            self._quiet(now, self.idle_s, None)
        else:
            with self._lock:
                self._misses[head] = now + self.miss_ttl_s
                self._misses.move_to_end(head)
                while len(self._misses) > MAX_MISSES:
                    self._misses.popitem(last=False)

    def _quiet(self, now: float, seconds: float, why: str | None) -> None:
        with self._lock:
            self._quiet_until = now + seconds
        if why is not None:
            log.warning("radix-global: %s", why)

    def _install(self, head: str, pairs: list[tuple[str, str]], now: float) -> None:
        with self._lock:
            old = self._heads.pop(head, None)
            if old is not None:
                self._drop(old.salted)
            self._heads[head] = _Head(now + self.ttl_s, tuple(s for s, _ in pairs))
            for salted, canonical in pairs:
                self._canonical[salted] = canonical
                known = self._aliases.setdefault(storage_page_key(canonical), set())
                known.add(salted)
            while len(self._aliases) > MAX_KNOWN_ALIASES:
                self._aliases.popitem(last=False)
            while len(self._heads) > self.max_heads:
                _, evicted = self._heads.popitem(last=False)
                self._drop(evicted.salted)

    def _drop(self, salted: Iterable[str]) -> None:
        for s in salted:
            self._canonical.pop(s, None)

    def translate(self, keys: Sequence[str]) -> list[str]:
        """Each key's canonical key, or the key itself: one consistent view of the map."""
        with self._lock:
            return [self._canonical.get(k, k) for k in keys]

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
            for s in new:
                self._announced[s] = None
            while len(self._announced) > MAX_KNOWN_ALIASES:
                self._announced.popitem(last=False)
            return new

    def forget_announced(self, salted: Iterable[str]) -> None:
        """These alias keys left the pool (their canonical page went): publish them again later."""
        with self._lock:
            for s in salted:
                self._announced.pop(s, None)
