"""Registered platform prefixes (router/keying/shared_prefixes.py), their definitions
(router/keying/prefix_specs.py) and the alias book (router/keying/alias_book.py)."""

from __future__ import annotations

import threading
import time

import pytest

from radix_global.aliases import alias_pairs
from radix_global.keys import page_digests, page_keys
from radix_global.types import Namespace, PoolPageKey
from router.keying import shared_prefixes as sp
from router.keying.alias_book import AliasBook
from router.keying.prefix_specs import (
    MAX_PREFIX_TOKENS,
    PrefixSpec,
    SharedPrefixError,
    SharedPrefixExists,
    parse_spec,
    specs_from_mapping,
)
from router.keying.shared_prefixes import SharedPrefixes
from router.keying.tenants import Tenants, read_tenants_file

NS = Namespace("tiny@1")
P = tuple(range(100, 132))  # 32 tokens: 8 pages of 4


class Encoder:
    def __init__(self) -> None:
        self.calls = 0
        self.threads: set[threading.Thread] = set()

    def encode_text(self, text: str) -> list[int]:
        self.calls += 1
        self.threads.add(threading.current_thread())
        if text == "broken":
            raise RuntimeError("no")
        return [ord(c) for c in text]

    def encode_chat(self, messages, tools=None, template_kwargs=None) -> list[int]:
        return [1, *[ord(c) for m in messages for c in m["content"]], 2]


def test_the_longest_registered_prefix_of_the_model_wins_in_full_pages():
    prefixes = SharedPrefixes([PrefixSpec("short", "tiny", token_ids=P[:12]),
                               PrefixSpec("long", "tiny", token_ids=P),
                               PrefixSpec("other", "big", token_ids=P)])
    m = prefixes.match("tiny", [*P, 7, 7, 7, 7], 4)
    assert m is not None and (m.name, m.pages) == ("long", 8)
    m = prefixes.match("tiny", [*P[:10], 9, 9], 4)  # diverges inside page 3
    assert m is not None and m.pages == 2
    assert prefixes.match("tiny", [9, *P], 4) is None
    assert prefixes.match("nobody", list(P), 4) is None


def test_text_and_messages_prefixes_are_tokenized_once_off_the_calling_thread():
    """Issue 35 item 8: they were tokenized inside ``match``, on the router's event loop, at the
    first eligible request. Now that request only starts the tokenization on a thread of its
    own and goes on without them; later requests match."""
    enc = Encoder()
    prefixes = SharedPrefixes([PrefixSpec("t", "tiny", text="abcdefgh"),
                               PrefixSpec("c", "tiny", messages=({"role": "system",
                                                                  "content": "xyz!"},)),
                               PrefixSpec("bad", "tiny", text="broken")])
    assert prefixes.needs_tokenizer("tiny") and not prefixes.needs_tokenizer("big")
    assert prefixes.match("tiny", [ord(c) for c in "abcdefgh"], 4) is None  # no tokenizer yet
    assert prefixes.match("tiny", [ord(c) for c in "abcdefghij"], 4, enc) is None  # started
    assert not prefixes.needs_tokenizer("tiny")  # being tokenized: no need to load another
    assert prefixes.wait_idle(10)
    assert enc.threads and threading.current_thread() not in enc.threads
    m = prefixes.match("tiny", [ord(c) for c in "abcdefghij"], 4, enc)
    assert m is not None and (m.name, m.pages) == ("t", 2)
    m = prefixes.match("tiny", [1, *[ord(c) for c in "xyz!"], 2, 5, 5], 2, enc)
    assert m is not None and (m.name, m.pages) == ("c", 3)
    assert not prefixes.needs_tokenizer("tiny") and prefixes.pending() == 0
    calls = enc.calls  # the broken one is skipped, not retried
    prefixes.match("tiny", [1, 2, 3], 1, enc)
    assert prefixes.wait_idle(10) and enc.calls == calls


class SlowEncoder(Encoder):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def encode_text(self, text: str) -> list[int]:
        assert self.release.wait(10)
        return super().encode_text(text)


def test_a_request_never_waits_for_a_prefix_being_tokenized():
    enc = SlowEncoder()
    prefixes = SharedPrefixes([PrefixSpec("t", "tiny", text="abcdefgh")])
    t0 = time.monotonic()
    for _ in range(3):
        assert prefixes.match("tiny", [ord(c) for c in "abcdefgh"], 4, enc) is None
    assert time.monotonic() - t0 < 1 and prefixes.pending("tiny") == 1
    enc.release.set()
    assert prefixes.wait_idle(10)
    assert prefixes.match("tiny", [ord(c) for c in "abcdefgh"], 4, enc) is not None


def test_a_registration_is_tokenized_at_once_when_the_tokenizer_is_known():
    enc = Encoder()
    prefixes = SharedPrefixes()
    prefixes.add(PrefixSpec("given", "tiny", text="abcd"), enc)  # the caller has the tokenizer
    assert prefixes.wait_idle(10) and prefixes.pending() == 0
    prefixes.match("tiny", [1, 2, 3, 4], 4, enc)  # a request of the model brings it
    prefixes.add(PrefixSpec("later", "tiny", text="efgh"))
    assert prefixes.wait_idle(10) and prefixes.pending() == 0  # before any request uses it
    prefixes.add(PrefixSpec("other", "big", text="efgh"))  # another model's: waits
    assert prefixes.wait_idle(10) and prefixes.pending("big") == 1


@pytest.mark.asyncio
async def test_register_waits_for_the_tokens_and_refuses_what_cannot_be_shared(monkeypatch):
    prefixes = SharedPrefixes()
    enc = Encoder()
    await prefixes.register(PrefixSpec("ok", "tiny", text="abcdefgh"), enc)
    assert prefixes.match("tiny", [ord(c) for c in "abcdefgh"], 4) is not None
    with pytest.raises(SharedPrefixError, match="cannot be tokenized"):
        await prefixes.register(PrefixSpec("bad", "tiny", text="broken"), enc)
    monkeypatch.setattr(sp, "MAX_PREFIX_TOKENS", 4)
    with pytest.raises(SharedPrefixError, match="5 tokens"):
        await prefixes.register(PrefixSpec("long", "tiny", text="abcde"), enc)
    assert [s.name for s in prefixes.specs()] == ["ok"]  # the refused ones are not kept
    monkeypatch.setattr(sp, "MAX_TOTAL_TOKENS", 10)
    with pytest.raises(SharedPrefixError, match="all prefixes together"):
        await prefixes.register(PrefixSpec("over", "tiny", text="wxyz"), enc)
    await prefixes.register(PrefixSpec("later", "tiny", text="wxyz"), None)  # no tokenizer yet
    assert prefixes.pending("tiny") == 1


def test_sizes_are_bounded_per_prefix_and_in_total(monkeypatch):
    monkeypatch.setattr(sp, "MAX_PREFIX_SOURCE_BYTES", 8)
    monkeypatch.setattr(sp, "MAX_TOTAL_SOURCE_BYTES", 12)
    monkeypatch.setattr(sp, "MAX_TOTAL_TOKENS", 6)
    prefixes = SharedPrefixes()
    with pytest.raises(SharedPrefixError, match="9 bytes of text"):
        prefixes.add(PrefixSpec("big", "m", text="é" * 4 + "x"))  # bytes, not characters
    prefixes.add(PrefixSpec("a", "m", text="12345678"))
    with pytest.raises(SharedPrefixError, match="all prefixes together"):
        prefixes.add(PrefixSpec("b", "m", text="12345"))
    prefixes.add(PrefixSpec("c", "m", text="1234"))
    prefixes.add(PrefixSpec("ids", "m", token_ids=(1, 2, 3, 4)))
    with pytest.raises(SharedPrefixError, match="all prefixes together"):
        prefixes.add(PrefixSpec("more", "m", token_ids=(1, 2, 3)))
    assert prefixes.remove("a")
    prefixes.add(PrefixSpec("d", "m", text="5678"))  # room again
    # tokenized past the total: kept registered, not shared, and said why
    prefixes.match("m", [1], 1, Encoder())
    assert prefixes.wait_idle(10)
    assert prefixes.match("m", [ord(c) for c in "1234"], 1) is None
    assert prefixes.match("m", [1, 2, 3, 4], 1) is not None


def test_a_prefix_removed_while_it_is_tokenized_is_not_resurrected():
    enc = SlowEncoder()
    prefixes = SharedPrefixes([PrefixSpec("t", "tiny", text="abcd")])
    prefixes.match("tiny", [1], 4, enc)
    assert prefixes.remove("t")
    prefixes.add(PrefixSpec("t", "tiny", text="wxyz"))  # the same name, another text
    enc.release.set()
    assert prefixes.wait_idle(10)
    assert prefixes.match("tiny", [ord(c) for c in "abcd"], 4) is None
    assert prefixes.match("tiny", [ord(c) for c in "wxyz"], 4) is not None


def test_share_past_prefix_is_the_unsafe_negative_control():
    prefixes = SharedPrefixes([PrefixSpec("p", "tiny", token_ids=P)], share_past_prefix=True)
    request = [*P, *range(40)]
    m = prefixes.match("tiny", request, 4)
    assert m is not None and m.pages == len(request) // 4 and m.tokens == tuple(request)


@pytest.mark.parametrize("name,spec", [
    ("a b", {"model": "m", "token_ids": [1]}),
    ("x" * 65, {"model": "m", "token_ids": [1]}),
    ("ok", {"token_ids": [1]}),
    ("ok", {"model": "m"}),
    ("ok", {"model": "m", "token_ids": [1], "text": "t"}),
    ("ok", {"model": "m", "token_ids": []}),
    ("ok", {"model": "m", "token_ids": [True]}),
    ("ok", {"model": "m", "token_ids": [0] * (MAX_PREFIX_TOKENS + 1)}),
    ("ok", {"model": "m", "text": ""}),
    ("ok", {"model": "m", "messages": [{"content": "no role"}]}),
    ("ok", {"model": "m", "token_ids": [1], "boundary": 3}),
    ("ok", "not a table"),
    ("ok", {"name": "other", "model": "m", "token_ids": [1]}),
])
def test_bad_definitions_are_refused_with_the_reason(name, spec):
    with pytest.raises(SharedPrefixError):
        parse_spec(name, spec)


def test_names_are_unique_and_the_count_bounded(monkeypatch):
    prefixes = SharedPrefixes([PrefixSpec("a", "m", token_ids=(1,))])
    with pytest.raises(SharedPrefixExists):
        prefixes.add(PrefixSpec("a", "m", token_ids=(2,)))
    monkeypatch.setattr(sp, "MAX_PREFIXES", 2)
    prefixes.add(PrefixSpec("b", "m", token_ids=(2,)))
    with pytest.raises(SharedPrefixError, match="at most"):
        prefixes.add(PrefixSpec("c", "m", token_ids=(3,)))
    assert prefixes.remove("a") and not prefixes.remove("a")
    assert [s.name for s in prefixes.specs()] == ["b"]


def test_the_tenants_file_holds_both_tables(tmp_path):
    path = tmp_path / "tenants.toml"
    path.write_text('[tenants.a]\napi_keys = ["k"]\n'
                    '[shared_prefixes.agent]\nmodel = "tiny"\ntext = "hello"\n')
    data = read_tenants_file(path)
    assert len(Tenants.from_mapping(data)) == 1
    assert [s.name for s in specs_from_mapping(data["shared_prefixes"])] == ["agent"]
    # A file without a [tenants] table: its other top-level tables are tenants, not prefixes.
    path.write_text('[a]\napi_keys = ["k"]\n[shared_prefixes.agent]\nmodel = "m"\ntext = "x"\n')
    assert len(Tenants.from_file(path)) == 1
    with pytest.raises(SharedPrefixError):
        specs_from_mapping(["not", "a", "table"])


def _head(tokens, salt):
    return page_keys(tokens, 4, cache_salt=salt)[0], PoolPageKey(
        page_digests(tokens, 4, cache_salt=salt)[0].hex())


def test_the_alias_book_answers_per_head_bounded():
    prefixes = SharedPrefixes([PrefixSpec("p", "tiny", token_ids=P)])
    book = AliasBook(max_heads=2)
    match = prefixes.match("tiny", list(P), 4)
    assert match is not None
    heads = {}
    for salt in ("tenant:a", "tenant:b", "tenant:c"):
        key, hexhead = _head(list(P), salt)
        book.record(NS, key, salt, match, 4)
        book.record(NS, key, salt, match, 4)  # twice: one entry
        heads[salt] = hexhead
    assert len(book) == 2
    assert book.pairs(NS, heads["tenant:a"]) == []  # the oldest head left
    assert book.pairs(NS, heads["tenant:c"]) == alias_pairs(P, 4, "tenant:c")
    assert book.pairs(Namespace("other@1"), heads["tenant:c"]) == []
    book.forget("p")
    assert book.pairs(NS, heads["tenant:c"]) == [] and len(book) == 0


def test_an_entry_recorded_under_a_colliding_64_bit_head_is_not_answered():
    prefixes = SharedPrefixes([PrefixSpec("p", "tiny", token_ids=P)])
    match = prefixes.match("tiny", list(P), 4)
    assert match is not None
    book = AliasBook()
    key_b, head_b = _head(list(P), "tenant:b")
    _, head_a = _head(list(P), "tenant:a")
    book.record(NS, key_b, "tenant:a", match, 4)  # as if tenant:a's head had key_b's 64 bits
    assert book.pairs(NS, head_b) == []
    assert head_a != head_b


def test_canonical_keys_are_the_unsalted_chain_of_the_shared_pages():
    prefixes = SharedPrefixes([PrefixSpec("p", "tiny", token_ids=P)])
    request = [*P[:10], 9, 9]
    m = prefixes.match("tiny", request, 4)
    assert m is not None
    assert prefixes.canonical_keys(m, 4) == page_keys(request[:8], 4)
    full = prefixes.match("tiny", list(P), 4)
    assert full is not None and prefixes.canonical_keys(full, 4) == page_keys(list(P), 4)
    # hashed as far as a request matched, then extended: the same chain either way
    assert prefixes.canonical_keys(m, 4) == page_keys(request[:8], 4)
    fresh = SharedPrefixes([PrefixSpec("p", "tiny", token_ids=P)])
    assert fresh.canonical_keys(m, 4) == page_keys(request[:8], 4)
    assert len(fresh._canonical[("p", 4)]) == 2  # not the whole 8-page prefix
    assert fresh.canonical_keys(full, 4) == page_keys(list(P), 4)
    unsafe = SharedPrefixes([PrefixSpec("p", "tiny", token_ids=P)], share_past_prefix=True)
    long = [*P, *range(8)]
    um = unsafe.match("tiny", long, 4)
    assert um is not None and unsafe.canonical_keys(um, 4) == page_keys(long, 4)
