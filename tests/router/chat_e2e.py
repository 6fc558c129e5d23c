"""Shared steps of the router's end-to-end conversation tests (SGLang and vLLM workers): prompt
text, chat calls through the router, and waiting for the router and its index to catch up."""

from __future__ import annotations

import time
from typing import Any

import httpx

from radix_global.keys import page_keys
from radix_global.trace import synthetic_word
from radix_global.types import Namespace, WorkerId
from router.state import RouterState


def text(seed: int, words: int) -> str:
    """``words`` whole-word tokens of the test model, a different run per ``seed``."""
    return " ".join(synthetic_word((seed * 7919 + i) % 4000) for i in range(words))


def chat(client: httpx.Client, messages: list[dict[str, str]], max_tokens: int = 8,
         **extra: Any) -> httpx.Response:
    r = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        **extra})
    assert r.status_code == 200, r.text
    return r


def cached_tokens(r: httpx.Response) -> int:
    """The engine's ``usage.prompt_tokens_details.cached_tokens`` (0 when it reports none)."""
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)


def reply(r: httpx.Response) -> str:
    return str(r.json()["choices"][0]["message"]["content"])


def wait_router_ready(state: RouterState, workers: int = 2) -> None:
    """Until the router discovered ``workers`` workers and profiled them all: before that, one
    worker would be priced with the (fast) default prior and another with its measured curve."""
    deadline = time.monotonic() + 60
    while len(state.registry) < workers:
        assert time.monotonic() < deadline, f"router discovered {len(state.registry)} workers"
        time.sleep(0.2)
    deadline = time.monotonic() + 300
    while state.profiler.pending():
        assert time.monotonic() < deadline, "profiling the workers did not finish"
        time.sleep(0.5)
    outcomes = state.profiler.outcomes
    assert all(p.get("state") == "done" for p in outcomes.values()), outcomes


def wait_indexed(state: RouterState, worker: str, messages: list[dict[str, str]], model: str,
                 page_size: int, every_page: bool = True) -> int:
    """KV events arrive asynchronously: wait until the index holds the chat prompt's pages on
    ``worker``'s GPU (all of them, or with ``every_page=False`` at least one); their count."""
    keys = page_keys(state.tokenizers.get(model).encode_chat(messages), page_size)
    ns = Namespace(state.registry.models()["tiny"])
    want = len(keys) if every_page else 1
    deadline = time.monotonic() + 30
    held = None
    while time.monotonic() < deadline:
        held = state.index.index.match(ns, keys, time.monotonic()).matched.get(
            (WorkerId(worker), 0))
        if held is not None and held.gpu >= want:
            return held.gpu
        time.sleep(0.2)
    raise AssertionError(f"KV events of {worker} never covered {want} of the prompt's "
                         f"{len(keys)} pages (index holds {held}); stats {state.index.stats()}")
