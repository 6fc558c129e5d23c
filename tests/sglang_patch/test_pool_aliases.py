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
        return {"pairs": self.answer if head == HEAD else [], "prefixes": 1}


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


def test_a_failing_router_is_no_alias_counted_and_backed_off():
    router, clock = Router(error=httpx.ConnectError("refused")), Clock()
    r = AliasResolver(router, clock)
    r.learn(HEAD)
    assert r.canonical(HEAD) is None and r.failures == 1 and r.quiet
    r.learn("cd" * 32)  # backing off: not asked
    clock.t = 1.5
    r.learn(HEAD)  # asked again, fails again: the next wait doubles
    clock.t = 3.0
    r.learn(HEAD)
    assert len(router.asked) == 2 and r.failures == 2
    router.error = None
    clock.t = 4.0
    r.learn(HEAD)
    assert r.canonical(HEAD) is not None and not r.quiet


def test_a_router_without_the_endpoint_is_asked_again_only_much_later():
    router, clock = Router(error=AliasUnavailable("no endpoint")), Clock()
    r = AliasResolver(router, clock, reprobe_s=300)
    r.learn(HEAD)
    r.learn("cd" * 32)
    assert r.quiet and router.asked == [HEAD]
    router.error = None
    clock.t = 301
    r.learn(HEAD)
    assert r.canonical(HEAD) is not None


def test_a_router_without_prefixes_is_not_asked_for_a_while():
    asked = []

    def none_registered(head):
        asked.append(head)
        return {"pairs": [], "prefixes": 0}

    clock = Clock()
    r = AliasResolver(none_registered, clock, idle_s=10)
    r.learn(HEAD)
    r.learn("cd" * 32)
    clock.t = 11
    r.learn("ef" * 32)
    assert asked == [HEAD, "ef" * 32]


@pytest.mark.parametrize("answer", [None, [1], {"pairs": [1, [2]]}, {"pairs": "x"}, "text"])
def test_an_answer_of_the_wrong_shape_is_a_counted_failure_not_an_exception(answer):
    r = AliasResolver(lambda head: answer)
    r.learn(HEAD)
    assert r.canonical(HEAD) is None


def test_heads_are_bounded_and_an_evicted_head_takes_its_aliases():
    heads = {}
    for salt in ("tenant:a", "tenant:b", "tenant:c"):
        pairs = [list(p) for p in alias_pairs(PREFIX, 8, salt)]
        heads[pairs[0][0]] = pairs
    r = AliasResolver(lambda head: {"pairs": heads.get(head, [])}, max_heads=2)
    first, *rest = heads
    for head in heads:
        r.learn(head)
    assert r.canonical(first) is None
    assert all(r.canonical(h) is not None for h in rest)
    assert r.translate([first, *rest]) == [first, *(heads[h][0][1] for h in rest)]
    tag = page_key(bytes.fromhex(heads[first][0][1]))
    # the evicted head's alias keys are still known: a later eviction can name them
    assert r.aliases_of(tag) == sorted(heads[h][0][0] for h in heads)


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
    assert fetch(HEAD) == {"pairs": PAIRS}
    assert seen[0].headers["authorization"] == "Bearer tok"
    assert seen[0].url.params["namespace"] == "tiny@1" and seen[0].url.params["head"] == HEAD
    old = http_fetch("http://router:1/base", "tiny@1", None,
                     transport=httpx.MockTransport(handler))
    with pytest.raises(AliasUnavailable):
        old(HEAD)  # an older router (or an index service): no such endpoint
