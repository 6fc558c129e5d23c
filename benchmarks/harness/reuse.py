"""Where a replayed request's reusable prefix went (pure; no I/O).

The definitions are ``docs/interfaces.md``, "The reuse breakdown": *available* (shared with an
earlier request whose prefill had finished anywhere, whole pages, at most ``prompt - 1`` tokens),
*captured* (the router's predicted prefix), *delivered* (the engine's cached tokens by tier) and
*late* (planned L3 fetches the engine did not report). ``available`` is computed here from the
plan's token ids and the client's own timings, so it exists for every contender.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radix_global_tools.replay.stats import RequestResult


class PageTrie:
    """Page-aligned prefixes seen so far, exactly (no hashing): a node per (parent, page)."""

    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = page_size
        self._nodes: dict[tuple[int, tuple[int, ...]], int] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def _pages(self, ids: Sequence[int]) -> list[tuple[int, ...]]:
        p = self.page_size
        return [tuple(ids[k:k + p]) for k in range(0, len(ids) - p + 1, p)]

    def add(self, ids: Sequence[int]) -> None:
        node = 0
        for page in self._pages(ids):
            node = self._nodes.setdefault((node, page), len(self._nodes) + 1)

    def match(self, ids: Sequence[int]) -> int:
        """Tokens of the longest page-aligned prefix of ``ids`` that was added."""
        node, pages = 0, 0
        for page in self._pages(ids):
            nxt = self._nodes.get((node, page))
            if nxt is None:
                break
            node, pages = nxt, pages + 1
        return pages * self.page_size


def reusable_cap(prompt_tokens: int, page_size: int) -> int:
    """The most an engine can reuse of a prompt: whole pages, never its last token."""
    return max(0, (prompt_tokens - 1) // page_size * page_size)


def available_tokens(prompts: Sequence[Sequence[int]], results: Sequence[RequestResult],
                     page_size: int) -> list[int]:
    """Per request (same order as ``prompts``/``results``): the available prefix (interfaces.md,
    "The reuse breakdown").

    A request's prefix becomes available at its first token (``sent_s + ttft_s``), even if its
    stream broke later; one that never got a token (rejected, failed before it) makes nothing
    available. Ties count as finished.
    """
    if len(prompts) != len(results):
        raise ValueError(f"{len(prompts)} prompts but {len(results)} results")
    finishes = sorted((r.sent_s + r.ttft_s, i) for i, r in enumerate(results)
                      if r.ttft_s is not None)
    trie = PageTrie(page_size)
    out = [0] * len(results)
    k = 0
    for i in sorted(range(len(results)), key=lambda j: results[j].sent_s):
        while k < len(finishes) and finishes[k][0] <= results[i].sent_s:
            trie.add(prompts[finishes[k][1]])
            k += 1
        out[i] = min(trie.match(prompts[i]), reusable_cap(len(prompts[i]), page_size))
    return out


def _total(values: Sequence[int | None]) -> int | None:
    """Sum, or None when any request lacks the value (a router that does not say)."""
    return None if not values or any(v is None for v in values) else sum(
        v for v in values if v is not None)


def _storage(r: RequestResult) -> int | None:
    """Tokens the engine loaded from L3; None when it cached some but gave no split (SGLang
    sends none for a request with nothing cached: that is 0 in every tier)."""
    if r.cached_tokens and r.device_cached_tokens is None and r.host_cached_tokens is None:
        return None
    return r.pool_tokens_loaded


def summarize_reuse(results: Sequence[RequestResult], available: Sequence[int]
                    ) -> dict[str, Any]:
    """Totals over the ``ok`` requests and where the tokens were lost (interfaces.md,
    "The reuse breakdown")."""
    if len(results) != len(available):
        raise ValueError(f"{len(results)} results but {len(available)} available counts")
    ok = [(r, a) for r, a in zip(results, available, strict=True) if r.status == "ok"]
    prompt = sum(r.prompt_tokens for r, _ in ok)
    captured = _total([r.router_prefix_tokens for r, _ in ok])
    storage = [_storage(r) for r, _ in ok]
    # like the router's fetch shortfall: a request whose engine gave no split is left out
    late = None if any(r.router_fetch_tokens is None for r, _ in ok) else sum(
        max(0, r.router_fetch_tokens - s) for (r, _), s in zip(ok, storage, strict=True)
        if r.router_fetch_tokens is not None and s is not None)
    lost_capture = lost_delivery = 0
    for r, a in ok:
        c = a if r.router_prefix_tokens is None else min(r.router_prefix_tokens, a)
        lost_capture += a - c
        lost_delivery += c - min(r.cached_tokens, c)
    tiers = {tier: _total([0 if r.cached_tokens == 0 else getattr(r, f"{tier}_cached_tokens")
                           for r, _ in ok]) for tier in ("device", "host")}
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "available": sum(a for _, a in ok),
        # the router's own view of the same (its index at the decision; None: no header)
        "available_router": _total([r.router_available_tokens for r, _ in ok]),
        "captured": captured,
        "delivered": sum(r.cached_tokens for r, _ in ok),
        "delivered_device": tiers["device"],
        "delivered_host": tiers["host"],
        "delivered_storage": _total(storage),
        "late": late,
        "lost": {"not_available": prompt - sum(a for _, a in ok),
                 "not_captured": None if captured is None else lost_capture,
                 "not_delivered": lost_delivery},
    }
    for key in ("available", "available_router", "captured", "delivered"):
        v = out[key]
        out[f"{key}_fraction"] = v / prompt if prompt and v is not None else None
    return out
