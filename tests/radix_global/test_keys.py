"""Page keys equal SGLang's HiCache storage keys and its KV-event block hashes.

Golden vectors run everywhere; the parity tests import SGLang itself (CPU stand-ins from
``sglang_patch.cpu_compat``) and compare against its own functions, including the C++ native hash.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from radix_global import keys


def _tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 2**31) for _ in range(n)]


def test_first_page_is_sha256_of_uint32_le_tokens() -> None:
    import hashlib
    import struct

    toks = [1, 2, 3, 4, 5, 6, 7, 8]
    d = keys.page_digests(toks, 4)
    first = hashlib.sha256(struct.pack("<4I", 1, 2, 3, 4)).digest()
    assert d[0] == first
    assert d[1] == hashlib.sha256(first + struct.pack("<4I", 5, 6, 7, 8)).digest()


def test_partial_last_page_ignored() -> None:
    toks = _tokens(130)
    assert len(keys.page_digests(toks, 64)) == 2
    assert keys.page_digests(toks, 64) == keys.page_digests(toks[:128], 64)
    assert keys.page_digests(toks[:63], 64) == []


def test_chain_continues_with_prior() -> None:
    toks = _tokens(256)
    whole = keys.page_digests(toks, 64, cache_salt="s")
    head = keys.page_digests(toks[:128], 64, cache_salt="s")
    tail = keys.page_digests(toks[128:], 64, prior=head[-1])
    assert head + tail == whole


def test_page_key_is_signed_int64_of_first_8_bytes() -> None:
    d = bytes([0xFF] * 8 + [0] * 24)
    assert keys.page_key(d) == -1
    d = bytes([0x7F] + [0xFF] * 7 + [0] * 24)
    assert keys.page_key(d) == 2**63 - 1
    assert keys.pool_key(d) == d.hex()
    toks = _tokens(128)
    assert keys.page_keys(toks, 64) == [keys.page_key(x) for x in keys.page_digests(toks, 64)]


def test_namespaces_separate_chains() -> None:
    toks = _tokens(64)
    variants = {
        tuple(keys.page_keys(toks, 64)),
        tuple(keys.page_keys(toks, 64, cache_salt="a")),
        tuple(keys.page_keys(toks, 64, extra_key="a")),
        tuple(keys.page_keys(toks, 64, extra_key="a", cache_salt="a")),
        tuple(keys.page_keys(toks, 64, extra_key="")),
    }
    assert len(variants) == 5
    # SGLang's RadixKey treats an empty salt as no salt.
    assert keys.page_keys(toks, 64, cache_salt="") == keys.page_keys(toks, 64)


def test_bad_input_refused() -> None:
    with pytest.raises(ValueError):
        keys.page_digests([1, 2], 0)
    with pytest.raises(ValueError):
        keys.page_digests([-1, 2], 2)
    with pytest.raises(ValueError):
        keys.page_digests([1, 2], 2, prior=b"short")


def test_compiled_chain_is_built_and_equals_the_python_loop() -> None:
    """The project's install builds the C chain (``radix_global/_chainhash.c``); a build that
    silently fell back to Python would cost every request ~50 us, so its absence fails here."""
    from array import array

    from hypothesis import given, settings
    from hypothesis import strategies as st

    assert keys._chain_native is not None and keys._chain is keys._chain_native

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.integers(0, 2**32 - 1), max_size=300), st.integers(1, 40),
           st.sampled_from([b"", bytes(range(32))]))
    def same(tokens: list[int], page: int, prior: bytes) -> None:
        data = array("I", tokens[: len(tokens) - len(tokens) % page]).tobytes()
        assert keys._chain_native(data, page * 4, prior) == keys._chain_py(data, page * 4, prior)

    same()
    with pytest.raises(ValueError, match="whole number"):
        keys._chain_native(b"123", 2, b"")
    with pytest.raises(ValueError, match="page_bytes"):
        keys._chain_native(b"", 0, b"")
    with pytest.raises(ValueError, match="32-byte"):
        keys._chain_native(b"12", 2, b"short")
    with pytest.raises(TypeError):
        keys._chain_native("text", 2, b"")


def test_lora_extra_key_is_stable_uuid5() -> None:
    a = keys.lora_extra_key("ad", "/p")
    assert a == keys.lora_extra_key("ad", "/p") and len(a) == 32
    assert a != keys.lora_extra_key("ad", "/q")
    assert keys.lora_extra_key("ad", "/p", extra_key="u-") == "u-" + a


# ----------------------------------------------------------------------------- parity with SGLang


@pytest.fixture(scope="module")
def sgl() -> Any:
    from sglang_patch import cpu_compat

    cpu_compat.apply()
    from sglang.srt.disaggregation import kv_events
    from sglang.srt.mem_cache import events, radix_cache, utils

    class _NS:
        pass

    ns = _NS()
    ns.utils, ns.radix_cache, ns.events, ns.kv_events = utils, radix_cache, events, kv_events
    return ns


NAMESPACES = [(None, None), ("salt-1", None), (None, "extra"), ("salt-1", "extra"), ("", None)]


@pytest.mark.sglang
@pytest.mark.parametrize("page_size", [1, 4, 64])
@pytest.mark.parametrize(("cache_salt", "extra_key"), NAMESPACES)
def test_storage_digest_parity(sgl: Any, page_size: int, cache_salt: Any, extra_key: Any) -> None:
    toks = _tokens(4 * 64 + 3, seed=page_size)  # several pages and a partial one
    key = sgl.radix_cache.RadixKey(toks, extra_key=extra_key, cache_salt=cache_salt)
    ref = sgl.utils.get_storage_hash_str(key, None, page_size=page_size)
    full = len(toks) // page_size
    mine = keys.page_digests(toks, page_size, cache_salt=cache_salt, extra_key=extra_key)
    assert [d.hex() for d in mine] == ref[:full]  # SGLang also hashes the partial page; we don't
    assert keys.page_keys(toks, page_size, cache_salt=cache_salt, extra_key=extra_key) == [
        sgl.utils.hash_str_to_int64(h) for h in ref[:full]
    ]
    seed = sgl.utils.storage_namespace_seed(extra_key, key.cache_salt)
    assert (keys.storage_seed(extra_key, cache_salt) or b"").hex() == (seed or "")


@pytest.mark.sglang
def test_wide_token_page_parity(sgl: Any) -> None:
    toks = [1, 2**33, 3, 4, 5, 6]
    ref = sgl.utils.get_hash_str(toks, None, page_size=2)
    assert [d.hex() for d in keys.page_digests(toks, 2)] == ref


class _Alloc:
    device = "cpu"

    def free_segment(self, *args: Any, **kwargs: Any) -> None:
        pass


def _sglang_events(sgl: Any, toks: list[int], page_size: int, **kw: Any) -> list[int]:
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    cache = sgl.radix_cache.RadixCache.create_simulated(
        mock_allocator=_Alloc(),
        page_size=page_size,
        enable_kv_cache_events=True,
        dynamo_kv_event_format=kw.pop("dynamo", False),
        kv_event_lora_names=kw.pop("lora_names", None),
    )
    cache.take_events()
    # Two inserts: a prefix, then the whole sequence, so the second node chains off the first.
    half = (len(toks) // 2) // page_size * page_size
    for part in (toks[:half], toks):
        key = sgl.radix_cache.RadixKey(list(part), **kw)
        cache.insert(InsertParams(key=key, value=torch.arange(len(part))))
    evs = cache.take_events()
    return [h for e in evs for h in e.block_hashes]


@pytest.mark.sglang
@pytest.mark.parametrize("page_size", [1, 4, 64])
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize(("cache_salt", "extra_key"), NAMESPACES)
def test_event_hash_parity(
    sgl: Any, page_size: int, dynamo: bool, cache_salt: Any, extra_key: Any
) -> None:
    toks = _tokens(4 * 64 + 3, seed=7)
    ref = _sglang_events(
        sgl, toks, page_size, dynamo=dynamo, extra_key=extra_key, cache_salt=cache_salt
    )
    mine = keys.sglang_event_hashes(
        toks, page_size, cache_salt=cache_salt, extra_key=extra_key, dynamo_format=dynamo
    )
    assert ref == mine and len(mine) == len(toks) // page_size
    if (cache_salt or None, extra_key, dynamo) in ((None, None, False), (None, None, True)):
        # Plain requests: the event hash IS the page key (no rehash needed).
        assert mine == keys.page_keys(toks, page_size)
    if extra_key is not None and not cache_salt and not dynamo:
        # A non-LoRA extra_key is invisible in default-format events.
        assert mine == keys.page_keys(toks, page_size)
    if cache_salt:
        assert mine != keys.page_keys(toks, page_size, cache_salt=cache_salt, extra_key=extra_key)


@pytest.mark.sglang
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("cache_salt", [None, "s"])
def test_lora_event_hash_parity(sgl: Any, dynamo: bool, cache_salt: Any) -> None:
    extra_key = keys.lora_extra_key("adapter-a", "/models/a")
    names = sgl.events.KvEventLoraNames()

    class _Req:
        lora_id = extra_key[-32:]

    req = _Req()
    req.extra_key = extra_key  # type: ignore[attr-defined]
    names.register(req, "adapter-a")
    toks = _tokens(64, seed=3)
    ref = _sglang_events(
        sgl, toks, 4, dynamo=dynamo, lora_names=names, extra_key=extra_key, cache_salt=cache_salt
    )
    mine = keys.sglang_event_hashes(
        toks, 4, cache_salt=cache_salt, extra_key=extra_key, lora_named=True, dynamo_format=dynamo
    )
    assert ref == mine
    assert mine != keys.sglang_event_hashes(toks, 4, cache_salt=cache_salt)
