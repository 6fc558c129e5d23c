"""The pool backend's alias resolver (``sglang_patch/pool/aliases.py``) with a fake router."""

from __future__ import annotations

import httpx
import pytest

from radix_global.aliases import alias_pairs
from radix_global.keys import page_key
from sglang_patch.pool.aliases import AliasResolver, AliasUnavailable, http_fetch

PREFIX = list(range(1, 33))
PAIRS = [list(p) for p in alias_pairs(PREFIX, 8, "tenant:b")]
HEAD = PAIRS[0][0]


class Router:
    def __init__(self, answer=None, error: Exception | None = None) -> None:
        self.answer = PAIRS if answer is None else answer
        self.error = error
        self.asked: list[str] = []

    def __call__(self, head: str):
        self.asked.append(head)
        if self.error is not None:
            raise self.error
        return self.answer if head == HEAD else []


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_learns_a_head_once_per_ttl_and_resolves_its_pages():
    router, clock = Router(), Clock()
    r = AliasResolver(router, clock, ttl_s=60)
    r.learn(HEAD)
    r.learn(HEAD)
    assert router.asked == [HEAD]
    assert [r.canonical(s) for s, _ in PAIRS] == [c for _, c in PAIRS]
    assert r.canonical("ab" * 32) is None
    assert r.aliases_of(page_key(bytes.fromhex(PAIRS[1][1]))) == [PAIRS[1][0]]
    clock.t = 61
    r.learn(HEAD)
    assert router.asked == [HEAD, HEAD]


def test_an_unknown_head_is_asked_again_after_the_short_ttl():
    router, clock = Router(), Clock()
    r = AliasResolver(router, clock, miss_ttl_s=5)
    other = "cd" * 32
    r.learn(other)
    r.learn(other)
    clock.t = 6
    r.learn(other)
    assert router.asked == [other, other]


@pytest.mark.parametrize("answer", [
    [["zz" * 32, PAIRS[0][1]]],  # not hex
    [[PAIRS[1][0], PAIRS[1][1]]],  # starts at another page than the head asked about
    [[HEAD]],  # not a pair
    [[HEAD, "ab"]],  # short key
])
def test_a_malformed_or_foreign_answer_is_no_alias(answer):
    r = AliasResolver(Router(answer=answer))
    r.learn(HEAD)
    assert r.canonical(HEAD) is None


def test_a_failing_router_is_no_alias_and_counted():
    r = AliasResolver(Router(error=httpx.ConnectError("refused")))
    r.learn(HEAD)
    assert r.canonical(HEAD) is None and r.failures == 1 and not r.disabled


def test_a_router_without_the_endpoint_turns_aliases_off():
    router = Router(error=AliasUnavailable("no endpoint"))
    r = AliasResolver(router)
    r.learn(HEAD)
    r.learn("cd" * 32)
    assert r.disabled and router.asked == [HEAD]


def test_heads_are_bounded_and_an_evicted_head_takes_its_aliases():
    heads = {}
    for salt in ("tenant:a", "tenant:b", "tenant:c"):
        pairs = [list(p) for p in alias_pairs(PREFIX, 8, salt)]
        heads[pairs[0][0]] = pairs
    r = AliasResolver(lambda head: heads.get(head, []), max_heads=2)
    first, *rest = heads
    for head in heads:
        r.learn(head)
    assert r.canonical(first) is None
    assert all(r.canonical(h) is not None for h in rest)
    tag = page_key(bytes.fromhex(heads[first][0][1]))
    assert r.aliases_of(tag) == sorted(heads[h][0][0] for h in rest)


def test_announce_names_each_alias_key_once_until_it_is_forgotten():
    r = AliasResolver(Router())
    r.learn(HEAD)
    keys = [s for s, _ in PAIRS]
    assert r.announce(keys) == keys
    assert r.announce(keys) == []
    assert r.announce(["ab" * 32]) == []  # no alias: nothing to announce
    r.forget_announced(keys[:1])
    assert r.announce(keys) == keys[:1]


def test_http_fetch_asks_the_router_with_the_admin_token():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path != "/admin/pool-aliases":
            return httpx.Response(404)
        return httpx.Response(200, json={"pairs": PAIRS})

    fetch = http_fetch("http://router:1/", "tiny@1", "tok",
                       transport=httpx.MockTransport(handler))
    assert fetch(HEAD) == PAIRS
    assert seen[0].headers["authorization"] == "Bearer tok"
    assert seen[0].url.params["namespace"] == "tiny@1" and seen[0].url.params["head"] == HEAD
    old = http_fetch("http://router:1/base", "tiny@1", None,
                     transport=httpx.MockTransport(handler))
    with pytest.raises(AliasUnavailable):
        old(HEAD)  # an older router (or an index service): no such endpoint
