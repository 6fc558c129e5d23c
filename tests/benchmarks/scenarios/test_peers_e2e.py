"""Today's peer as its users run it (issue 42): smg 1.13 in its cache-aware mode, in front of
two stock SGLang CPU engines started the way the benchmarks start them, sends each
conversation's next turn to the engine that holds its history; ``round_robin`` over the same
engines, the negative control, does not.

Two conversations' first turns go to different engines, one after the other (smg's cache-aware
mode sends a request that matches nothing to the engine whose tree holds least; sent while the
first was still in flight, the second went to the same engine in a CI run), a short unrelated
request follows, then each conversation's second turn, which extends its first turn's prompt.
The engines say how many prompt tokens they took from their cache (``meta_info.cached_tokens``);
probes sent straight to each engine at the end show where each history lives.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from radix_global.trace import synthetic_word
from radix_global_tools.cluster.local import EngineSet, LocalCluster, RouterSpec

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, pytest.mark.slow]


def _text(start: int, words: int) -> str:
    return " ".join(synthetic_word(start + i) for i in range(words))


def _generate(client: httpx.Client, url: str, text: str, new_tokens: int) -> dict[str, Any]:
    resp = client.post(f"{url}/generate", json={"text": text, "sampling_params": {
        "max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0}})
    assert resp.status_code == 200, resp.text[:300]
    return resp.json()


def _until_routing(client: httpx.Client, url: str, timeout_s: float = 120.0) -> None:
    """Until the router forwards a request (smg adds its workers after it answers /health)."""
    deadline = time.monotonic() + timeout_s
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}
    while client.post(f"{url}/generate", json=body).status_code != 200:
        assert time.monotonic() < deadline, f"{url} never routed a request"
        time.sleep(0.5)


def _second_turns(client: httpx.Client, router: str, first: int) -> tuple[int, int, str, str]:
    """Cached tokens of two conversations' second turns through ``router``; their first
    prompts (word ``first`` on: each run its own words, so no cache of an earlier run helps)."""
    a1, b1 = _text(first, 400), _text(first + 1000, 400)
    a_out = _generate(client, router, a1, 8)["text"]
    b_out = _generate(client, router, b1, 8)["text"]  # cold: the engine that cached less
    _generate(client, router, _text(first + 3000, 40), 1)  # an unrelated short request
    a2 = _generate(client, router, f"{a1}{a_out} {_text(first + 2000, 60)}", 1)
    b2 = _generate(client, router, f"{b1}{b_out} {_text(first + 2500, 60)}", 1)
    return a2["meta_info"]["cached_tokens"], b2["meta_info"]["cached_tokens"], a1, b1


def test_smg_cache_aware_sends_each_next_turn_to_its_history_and_round_robin_does_not(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "run") as cluster, httpx.Client(timeout=120) as client:
        engines = cluster.start_engines(EngineSet("stock", str(tiny_model_dir), n=2,
                                                  kv_events=False))
        aware = cluster.start_router(RouterSpec("smg", "cache_aware"), engines)
        _until_routing(client, aware.url)
        a_hit, b_hit, a1, b1 = _second_turns(client, aware.url, 0)
        # each history on its own engine: a probe straight to an engine hits only its holder
        held = {name: [_generate(client, url, prompt, 1)["meta_info"]["cached_tokens"] > 100
                       for url in engines.urls] for name, prompt in (("a", a1), ("b", b1))}
        assert held["a"] != held["b"] and sorted(held["a"]) == [False, True], held
        assert a_hit > 300 and b_hit > 300, (a_hit, b_hit)  # most of the first turn's prompt

        turns = cluster.start_router(RouterSpec("smg", "round_robin"), engines)
        _until_routing(client, turns.url)
        a_miss, b_miss, _, _ = _second_turns(client, turns.url, 5_000)
        assert a_miss < 100 and b_miss < 100, (a_miss, b_miss)  # the other engine, cold
