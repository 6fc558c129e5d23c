"""The shared-prefix rule (radix_global/aliases.py): the boundary against a brute-force model,
and the alias pairs against the page-key chain they must equal on both sides."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix_global.aliases import alias_pairs, shared_pages
from radix_global.keys import page_digests, page_keys, storage_seed

tokens = st.lists(st.integers(0, 7), max_size=40)  # a small alphabet: long common prefixes


@given(tokens, tokens, st.integers(1, 6))
def test_shared_pages_are_the_full_pages_equal_to_the_prefix(request, prefix, page_size):
    brute = 0
    while ((brute + 1) * page_size <= min(len(request), len(prefix))
           and request[: (brute + 1) * page_size] == prefix[: (brute + 1) * page_size]):
        brute += 1
    assert shared_pages(request, prefix, page_size) == brute


@given(st.lists(st.integers(0, 2**31), min_size=1, max_size=40), st.integers(1, 6),
       st.text(min_size=1, max_size=8))
def test_pairs_map_the_salted_chain_onto_the_unsalted_one(prefix, page_size, salt):
    pairs = alias_pairs(prefix, page_size, salt)
    assert len(pairs) == len(prefix) // page_size
    assert [p.salted for p in pairs] == [d.hex() for d in page_digests(prefix, page_size,
                                                                      cache_salt=salt)]
    assert [p.canonical for p in pairs] == [d.hex() for d in page_digests(prefix, page_size)]


def test_salted_keys_are_sglangs_storage_chain_seeded_by_the_salt():
    """The salted key of page 0 is SHA-256(storage seed || page): what SGLang's HiCache asks
    the backend for (keys.py's chain is tested against SGLang itself in test_keys)."""
    import hashlib
    import struct

    prefix = list(range(8))
    (pair, _) = alias_pairs(prefix, 4, "tenant:b")
    page = struct.pack("<4I", *prefix[:4])
    seed = storage_seed(None, "tenant:b")
    assert seed is not None
    assert pair.salted == hashlib.sha256(seed + page).hexdigest()
    assert pair.canonical == hashlib.sha256(page).hexdigest()
    assert page_keys(prefix, 4)[0] == int.from_bytes(bytes.fromhex(pair.canonical)[:8], "big",
                                                      signed=True)


def test_an_alias_needs_a_salt_and_a_page_size():
    with pytest.raises(ValueError):
        alias_pairs([1, 2], 1, "")
    with pytest.raises(ValueError):
        shared_pages([1], [1], 0)
