"""The shared-prefix rule: which pages of a salted request are a registered platform prefix,
and the pool aliases that let every tenant read them (``docs/interfaces.md`` section
"Shared platform prefixes across isolated tenants").

Pure functions over token ids; the router (``router/keying/shared_prefixes.py``) and the tests
use them, and the pool backend (``sglang_patch/pool/aliases.py``) only ever sees their output.

- :func:`shared_pages`: how many full pages of a request equal the start of a prefix: the
  boundary. Only these pages are shared; everything after stays in the request's namespace.
- The canonical keys of those pages are the *unsalted* chain (:func:`radix_global.keys.page_keys`
  with no salt), the keys the shared namespace gives them.
- :func:`alias_pairs`: ``(salted digest, canonical digest)`` per full page of a prefix, as the
  64-hex-digit storage keys SGLang hands the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from radix_global.keys import page_digests
from radix_global.types import PoolPageKey


class AliasPair(NamedTuple):
    salted: PoolPageKey  # the storage key a salted request's engine asks for
    canonical: PoolPageKey  # the key the page is stored under, for every tenant


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the common case: the request starts with the whole prefix
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shared_pages(tokens: Sequence[int], prefix: Sequence[int], page_size: int) -> int:
    """Full pages of ``tokens`` whose tokens all equal ``prefix``'s at the same positions."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    return common_prefix_len(tokens, prefix) // page_size


def alias_pairs(tokens: Sequence[int], page_size: int, salt: str) -> list[AliasPair]:
    """The aliases of every full page of ``tokens`` (a prefix's, or in the unsafe share-all
    negative control a whole request's) for requests salted with ``salt``."""
    if not salt:
        raise ValueError("an alias needs a salt: an unsalted request already uses the "
                         "canonical keys")
    salted = page_digests(tokens, page_size, cache_salt=salt)
    canonical = page_digests(tokens, page_size)
    return [AliasPair(PoolPageKey(s.hex()), PoolPageKey(c.hex()))
            for s, c in zip(salted, canonical, strict=True)]
