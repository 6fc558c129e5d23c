"""Profiling an engine without SGLang's ``/generate`` (vLLM): the same plan through OpenAI
``/v1/completions`` with token-id prompts and ``max_tokens=1`` (router/cluster/profiling.py)."""

from __future__ import annotations

import asyncio
import json

import httpx

from router.cluster.profiling import ProfileSample, fit_profile, profile_worker


def test_profile_worker_through_openai_completions() -> None:
    seen: list[tuple[int, ...]] = []
    bodies: list[dict[str, object]] = []

    async def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/completions":
            return httpx.Response(404)
        body = json.loads(request.content)
        bodies.append(body)
        ids = tuple(body["prompt"])
        cached = max((len(s) for s in seen if ids[: len(s)] == s), default=0)
        seen.append(ids)
        await asyncio.sleep(2e-4 * (len(ids) - cached))
        return httpx.Response(200, json={"choices": [{"text": "x"}]})

    async def run() -> list[ProfileSample]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
            return await profile_worker(client, "http://w0", 128, max_input_tokens=1024,
                                        sizes=2, model="tiny")

    samples = asyncio.run(run())
    assert sorted((s.input_tokens, s.prefix_tokens) for s in samples) == [
        (512, 0), (512, 256), (1024, 0), (1024, 512)]
    assert all(b["model"] == "tiny" and b["max_tokens"] == 1 for b in bodies)
    model = fit_profile(samples)
    assert 1e-4 < (model.predict(1024, 0) - model.predict(1024, 512)) / 512 < 4e-4
