"""Page keys: one pure chained hash over token ids, byte-identical to SGLang's.

Contract (``docs/interfaces.md`` section "Page keys"):

* ``digest_i = SHA-256(digest_{i-1} || page_i)``, ``page_i`` = the page's tokens as uint32
  little-endian. A page holding a token id above 2**32-1 is hashed "wide": one ``0xff`` byte, then
  the tokens as uint64 little-endian (SGLang's native ``hash_binding.cpp`` does exactly this).
* The chain starts from ``prior`` if given, else from :func:`storage_seed` of ``(extra_key,
  cache_salt)`` (SGLang ``storage_namespace_seed``), else from nothing (first page hashes only its
  tokens). This equals SGLang's HiCache storage keys (``get_storage_hash_str``).
* :func:`pool_key` = hex digest (SGLang's storage key); :func:`page_key` = signed int64 of the first
  8 digest bytes (SGLang ``hash_str_to_int64``), which for an unsalted non-LoRA page is also
  SGLang's KV-event block hash.
* Only full pages are keyed; a trailing partial page is ignored.

The chain's loop runs in C (``radix_global/_chainhash.c``) where the install compiled it, in
Python otherwise; both give the same bytes (tested against each other).

:func:`sglang_event_hashes` reproduces SGLang's KV-event block hashes for salted, LoRA and
dynamo-format requests, whose event hashes differ from the storage chain.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import sys
import uuid
from array import array
from collections.abc import Callable, Sequence

from radix_global.types import EngineHash, PageKey, PoolPageKey

_U32_MAX = 0xFFFFFFFF
_LITTLE_ENDIAN = sys.byteorder == "little"
_WIDE_TAG = b"\xff"
_STORAGE_SEED_TAG = b"sglang-cache-namespace-v1"
_LEGACY_SALT_TAG = b"sglang-cache-salt-v1\0"
_EVENT_NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"
_sha256 = hashlib.sha256


def _namespace_digest(tag: bytes, extra_key: str | None, cache_salt: str | None) -> bytes:
    # Presence byte + u64 LE length keep (None, "ab") / ("a", "b") / ("", ...) apart.
    h = _sha256(tag)
    for part in (extra_key, cache_salt):
        if part is None:
            h.update(b"\x00")
        else:
            encoded = part.encode("utf-8")
            h.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return h.digest()


def _normalize_salt(cache_salt: str | None) -> str | None:
    # SGLang's RadixKey stores ``cache_salt or None``: an empty salt is no salt.
    return cache_salt or None


def storage_seed(extra_key: str | None = None, cache_salt: str | None = None) -> bytes | None:
    """Chain seed of a namespaced request (SGLang ``storage_namespace_seed``), None if plain."""
    cache_salt = _normalize_salt(cache_salt)
    if extra_key is None and cache_salt is None:
        return None
    return _namespace_digest(_STORAGE_SEED_TAG, extra_key, cache_salt)


def lora_extra_key(lora_name: str, lora_path: str, extra_key: str | None = None) -> str:
    """The ``extra_key`` SGLang gives a request for a ``--lora-paths`` adapter.

    SGLang appends the adapter's ``lora_id`` to the request's extra key; for adapters given at
    launch that id is ``uuid5(NAMESPACE_URL, name + NUL + path).hex`` (``LoRARef``), so a router
    that knows the adapter's name and path derives the same namespace. Adapters loaded at runtime
    get a random id and cannot be reproduced.
    """
    lora_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{lora_name}\0{lora_path}").hex
    return (extra_key or "") + lora_id


def _page_bytes(tokens: Sequence[int], start: int, end: int) -> bytes:
    chunk = tokens[start:end]
    try:
        packed = array("I", chunk)
    except OverflowError:
        if any(t < 0 or t > 0x7FFFFFFFFFFFFFFF for t in chunk):
            raise ValueError("token id must be a non-negative int64") from None
        wide = array("Q", chunk)
        if not _LITTLE_ENDIAN:
            wide.byteswap()
        return _WIDE_TAG + wide.tobytes()
    if not _LITTLE_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _chain_py(data: bytes, page_bytes: int, prior: bytes) -> bytes:
    """The chain in Python: what ``radix_global._chainhash.chain_digests`` computes in C."""
    buf, out, sha = memoryview(data), [], _sha256
    for off in range(0, len(data), page_bytes):
        h = sha(prior)
        h.update(buf[off : off + page_bytes])
        prior = h.digest()
        out.append(prior)
    return b"".join(out)


_chain_native: Callable[[bytes, int, bytes], bytes] | None
try:  # built by the project's install (setuptools ext-modules, scripts/bootstrap.sh)
    from radix_global._chainhash import chain_digests as _chain_native
except ImportError:  # an install without a C compiler or OpenSSL headers: same keys, slower
    _chain_native = None
_chain = _chain_native if _chain_native is not None else _chain_py


def _digest_blob(tokens: Sequence[int], page_size: int, cache_salt: str | None,
                 extra_key: str | None, prior: bytes | None) -> bytes:
    """The digests of every full page of ``tokens``, 32 bytes each, concatenated."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if prior is None:
        prior = storage_seed(extra_key, cache_salt)
    elif len(prior) != 32:
        raise ValueError("prior must be a 32-byte SHA-256 digest")
    full = len(tokens) - len(tokens) % page_size
    if full == 0:
        return b""
    try:
        packed = array("I", tokens[:full])
    except OverflowError:  # a wide page (or a negative id, refused by _page_bytes)
        digests, seed = [], prior or b""
        for start in range(0, full, page_size):
            page = _page_bytes(tokens, start, start + page_size)
            seed = _chain(page, len(page), seed)
            digests.append(seed)
        return b"".join(digests)
    if not _LITTLE_ENDIAN:
        packed.byteswap()
    return _chain(packed.tobytes(), page_size * 4, prior or b"")


def page_digests(
    tokens: Sequence[int],
    page_size: int,
    *,
    cache_salt: str | None = None,
    extra_key: str | None = None,
    prior: bytes | None = None,
) -> list[bytes]:
    """SHA-256 chain digest (32 bytes) of every full page of ``tokens``.

    ``prior`` continues a chain (the digest of the page before ``tokens[0]``); it overrides the
    namespace seed, exactly as SGLang's ``get_storage_hash_str`` does.
    """
    blob = _digest_blob(tokens, page_size, cache_salt, extra_key, prior)
    return [blob[i : i + 32] for i in range(0, len(blob), 32)]


def page_key(digest: bytes) -> PageKey:
    """Internal page key: signed int64 of the digest's first 8 bytes (``hash_str_to_int64``)."""
    return PageKey(int.from_bytes(digest[:8], "big", signed=True))


def pool_key(digest: bytes) -> PoolPageKey:
    """SGLang's HiCache storage key of the page: the 64-hex-digit digest."""
    return PoolPageKey(digest.hex())


def storage_page_key(key: str) -> PageKey:
    """:func:`page_key` of a storage key (:func:`pool_key`'s hex digest, as SGLang hands it to
    the HiCache backend)."""
    return PageKey(int.from_bytes(bytes.fromhex(key[:16]), "big", signed=True))


def page_keys(
    tokens: Sequence[int],
    page_size: int,
    *,
    cache_salt: str | None = None,
    extra_key: str | None = None,
    prior: bytes | None = None,
) -> list[PageKey]:
    """:func:`page_key` of every full page (what the router matches against the index)."""
    blob = _digest_blob(tokens, page_size, cache_salt, extra_key, prior)
    return list(_heads(len(blob) // 32).unpack(blob))


@functools.lru_cache(maxsize=512)
def _heads(pages: int) -> struct.Struct:
    # Each digest's first 8 bytes as a big-endian int64, the other 24 skipped: one C call.
    return struct.Struct(">" + "q24x" * pages)


def event_namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """SGLang ``kv_event_namespace_seed``: None when both parts are absent."""
    if extra_key is None and cache_salt is None:
        return None
    return _namespace_digest(_EVENT_NAMESPACE_TAG, extra_key, cache_salt)


def namespaced_event_hash(block_hash: int, seed: bytes | None) -> EngineHash:
    """SGLang ``namespaced_block_hash``: int64 of SHA-256(seed || hash as i64 big-endian)[:8]."""
    if seed is None:
        return EngineHash(block_hash)
    digest = _sha256(seed + block_hash.to_bytes(8, "big", signed=True)).digest()
    return EngineHash(int.from_bytes(digest[:8], "big", signed=True))


def sglang_event_hashes(
    tokens: Sequence[int],
    page_size: int,
    *,
    cache_salt: str | None = None,
    extra_key: str | None = None,
    lora_named: bool = False,
    dynamo_format: bool = False,
) -> list[EngineHash]:
    """The block hashes SGLang publishes in ``BlockStored`` for ``tokens`` (full pages, from root).

    SGLang (``mem_cache/events.py``, ``compute_node_event_hash_values``) hashes event chains
    differently from storage chains when the request is namespaced:

    * plain request: the storage chain, so the hash equals :func:`page_key`;
    * with ``cache_salt``: the chain is seeded by SHA-256(``"sglang-cache-salt-v1\\0"`` + salt),
      ``extra_key`` is not hashed into the chain;
    * with only ``extra_key``: the unseeded chain (same hash as a plain request);
    * then each hash is namespaced (:func:`namespaced_event_hash`) by
      ``event_namespace_seed(extra_key, None)`` when the extra key is a LoRA adapter's with a
      published name (``lora_named``), or by ``event_namespace_seed(extra_key, cache_salt)`` in
      the dynamo format.
    """
    cache_salt = _normalize_salt(cache_salt)
    if extra_key is None and cache_salt is None:
        return [EngineHash(k) for k in page_keys(tokens, page_size)]
    prior = (
        _sha256(_LEGACY_SALT_TAG + cache_salt.encode("utf-8")).digest()
        if cache_salt is not None
        else None
    )
    raw = [page_key(d) for d in page_digests(tokens, page_size, prior=prior)]
    if dynamo_format:
        seed = event_namespace_seed(extra_key, cache_salt)
    else:
        seed = event_namespace_seed(extra_key if lora_named else None, None)
    return [namespaced_event_hash(h, seed) for h in raw]
