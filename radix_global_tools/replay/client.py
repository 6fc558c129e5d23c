"""``radix-global replay TRACE --router URL``: replay a Mooncake-format trace against a router.

Each trace line becomes one streamed SGLang ``/generate`` request (``--endpoint completions``:
OpenAI ``/v1/completions``; prompt text from the project's trace synthesis, ``ignore_eos`` with a
scaled output length), sent at its time-scaled timestamp
(open loop: a slow server does not slow the sender). Prints the scaling used and a summary, and
writes one JSON file: ``{"config", "summary", "requests": [per-request results]}``.
Scaling rules: ``radix_global_tools/replay/plan.py``; metric definitions:
``radix_global_tools/replay/stats.py``.

    radix-global replay benchmarks/data/conversation_sample.jsonl --router http://127.0.0.1:30080 \\
        --limit 60 --time-scale 0.5 --model-path build/tiny-llama --out /tmp/replay.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from radix_global.trace import TraceFormatError, prompt_text, read_trace
from radix_global_tools.replay.completions import (
    NO_USAGE,
    PATHS,
    Endpoint,
    apply_completion_chunk,
    completion_body,
    error_message,
)
from radix_global_tools.replay.plan import (
    PlanError,
    PlannedRequest,
    ReplayScaling,
    choose_tokens_per_hash_id,
    plan_requests,
    select_conversations,
    shared_prefix_tokens,
    time_scale_for,
)
from radix_global_tools.replay.stats import RequestResult, SloTargets, summarize

REJECT_STATUSES = (429, 503)


@dataclass(frozen=True)
class ClientOptions:
    request_timeout_s: float = 300.0
    max_duration_s: float = 1800.0  # outstanding requests are cancelled (failed) after this
    model: str | None = None  # sent as "model" when set
    temperature: float = 0.0
    endpoint: Endpoint = Endpoint.GENERATE
    # /generate only: the prompt as its token ids instead of text (what a router that keys only
    # tokenized requests needs, e.g. smg's cache_aware hash index)
    token_ids: bool = False

    def __post_init__(self) -> None:
        if self.token_ids and self.endpoint is not Endpoint.GENERATE:
            raise ValueError("token_ids: /generate only (OpenAI completions take text here)")


class ReplayReport(NamedTuple):
    results: list[RequestResult]
    summary: dict[str, Any]


def kv_bytes_per_token(model_path: str | Path, dtype_bytes: int = 4) -> int:
    """K and V bytes one token occupies across all layers, from the model's config.json."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    return 2 * int(cfg["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes


def apply_chunk(result: RequestResult, chunk: dict[str, Any], now: float, state: dict[str, float]
                 ) -> None:
    """Fold one streamed ``/generate`` chunk (cumulative text + meta_info) into ``result``."""
    error = error_message(chunk)
    if error is not None:
        result.status, result.error = "failed", error
        return
    meta = chunk.get("meta_info") or {}
    tokens = meta.get("completion_tokens")
    tokens = int(tokens) if tokens is not None else result.output_tokens + 1
    added = tokens - result.output_tokens
    if added <= 0:
        return
    if result.ttft_s is None:
        result.ttft_s = now - state["sent"]
    else:
        gap = (now - state["last"]) / added
        result.tbt_s.extend([gap] * added)
    state["last"] = now
    result.output_tokens = tokens
    if meta.get("cached_tokens") is not None:
        result.cached_tokens = int(meta["cached_tokens"])
    details = meta.get("cached_tokens_details")
    if isinstance(details, dict):
        result.device_cached_tokens = _int_or_none(details.get("device"))
        result.host_cached_tokens = _int_or_none(details.get("host"))
        result.pool_tokens_loaded = _int_or_none(details.get("storage")) or 0


def _header_int(headers: httpx.Headers, name: str) -> int | None:
    value = headers.get(name)
    return int(value) if value and value.isdigit() else None


def _header_ms(headers: httpx.Headers, name: str) -> float | None:
    ms = _header_int(headers, name)
    return None if ms is None else ms / 1000.0


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) else None


async def send_one(client: httpx.AsyncClient, url: str, planned: PlannedRequest, text: str,
                   t0: float, opts: ClientOptions, scheduled_s: float | None = None
                   ) -> RequestResult:
    if opts.endpoint is Endpoint.COMPLETIONS:
        body = completion_body(text, planned.output_tokens, opts.temperature, opts.model)
        fold = apply_completion_chunk
    else:
        body = {"stream": True, "sampling_params": {
            "max_new_tokens": planned.output_tokens, "ignore_eos": True,
            "temperature": opts.temperature}}
        body.update({"input_ids": planned.input_ids} if opts.token_ids else {"text": text})
        if opts.model:
            body["model"] = opts.model
        fold = apply_chunk
    sent = time.perf_counter()
    scheduled = planned.send_at_s if scheduled_s is None else scheduled_s
    result = RequestResult(planned.position, "ok", scheduled, sent - t0,
                           len(planned.input_ids), planned.output_tokens)
    state = {"sent": sent, "last": sent}
    try:
        async with client.stream("POST", url + PATHS[opts.endpoint], json=body,
                                 timeout=opts.request_timeout_s) as resp:
            result.http_status = resp.status_code
            result.worker = resp.headers.get("x-radix-worker")
            result.router_prefix_tokens = _header_int(resp.headers, "x-radix-prefix-tokens")
            result.router_fetch_tokens = _header_int(resp.headers, "x-radix-fetch-tokens")
            result.router_available_tokens = _header_int(resp.headers,
                                                         "x-radix-available-tokens")
            result.router_queue_s = _header_ms(resp.headers, "x-radix-predicted-queue-ms")
            result.router_ttft_s = _header_ms(resp.headers, "x-radix-predicted-ttft-ms")
            result.router_hold_s = _header_ms(resp.headers, "x-radix-hold-ms")
            if resp.status_code != 200:
                detail = (await resp.aread()).decode("utf-8", "replace")[:300]
                result.status = "rejected" if resp.status_code in REJECT_STATUSES else "failed"
                result.error = f"HTTP {resp.status_code}: {detail}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    result.status, result.error = "failed", f"bad SSE data: {data[:100]}"
                    break
                fold(result, chunk, time.perf_counter(), state)
                if result.status != "ok":
                    break
    except (httpx.HTTPError, OSError) as exc:
        result.status, result.error = "failed", f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError:
        result.status, result.error = "failed", "cancelled at the replay's max duration"
    if (result.status == "ok" and opts.endpoint is Endpoint.COMPLETIONS
            and "usage" not in state):
        result.status, result.error = "failed", NO_USAGE
    if result.status == "ok" and result.output_tokens < planned.output_tokens:
        result.status = "failed"
        result.error = f"stream ended after {result.output_tokens}/{planned.output_tokens} tokens"
    result.latency_s = time.perf_counter() - sent
    return result


async def stream_ids(client: httpx.AsyncClient, url: str, ids: list[int], output_tokens: int,
                     index: int, t0: float, headers: dict[str, str] | None = None
                     ) -> tuple[RequestResult, list[int]]:
    """One streamed greedy ``/generate`` of token ids (``ignore_eos``): its result (TTFT, cached
    tokens by tier) and the output token ids."""
    sent = time.perf_counter()
    result = RequestResult(index, "ok", sent - t0, sent - t0, len(ids), output_tokens)
    state = {"sent": sent, "last": sent}
    out: list[int] = []
    body = {"input_ids": ids, "stream": True, "sampling_params": {
        "max_new_tokens": output_tokens, "ignore_eos": True, "temperature": 0.0}}
    async with client.stream("POST", url + "/generate", json=body, headers=headers) as resp:
        result.http_status = resp.status_code
        if resp.status_code != 200:
            result.status, result.error = "failed", (await resp.aread()).decode()[:200]
            return result, out
        async for line in resp.aiter_lines():
            data = line[5:].strip() if line.startswith("data:") else ""
            if data and data != "[DONE]":
                chunk = json.loads(data)
                apply_chunk(result, chunk, time.perf_counter(), state)
                out = list(chunk.get("output_ids") or out)
    result.latency_s = time.perf_counter() - sent
    return result, out


async def run_replay(plan: Sequence[PlannedRequest], router_url: str | Sequence[str],
                     opts: ClientOptions, on_done: Callable[[RequestResult], None] | None = None
                     ) -> tuple[list[RequestResult], float]:
    """Send every planned request at its time (a request with ``after``: also ``think_s`` after
    that one ended, however it ended); return results (plan order) and the wall time.
    Several router URLs: request ``position`` goes to URL ``position % n``, as a round-robin load
    balancer in front of router replicas would send it (a conversation's turns change routers)."""
    texts = [prompt_text(p.input_ids) for p in plan]
    urls = [u.rstrip("/") for u in ([router_url] if isinstance(router_url, str) else router_url)]
    if not urls:
        raise ValueError("run_replay needs at least one router URL")
    limits = httpx.Limits(max_connections=max(16, len(plan)), max_keepalive_connections=64)
    ended = {p.position: asyncio.Event() for p in plan}
    unknown = {p.after for p in plan if p.after is not None} - ended.keys()
    if unknown:
        raise ValueError(f"requests planned after positions not in the plan: {sorted(unknown)}")
    ended_at: dict[int, float] = {}
    async with httpx.AsyncClient(limits=limits, timeout=opts.request_timeout_s) as client:
        t0 = time.perf_counter()

        async def scheduled(p: PlannedRequest, text: str) -> RequestResult:
            try:
                at = p.send_at_s
                await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                if p.after is not None:
                    await ended[p.after].wait()
                    at = max(at, ended_at[p.after] + p.think_s)
                    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                r = await send_one(client, urls[p.position % len(urls)], p, text, t0, opts,
                                   scheduled_s=at)
            finally:
                ended_at[p.position] = time.perf_counter() - t0
                ended[p.position].set()
            if on_done is not None:
                on_done(r)
            return r

        tasks = [asyncio.create_task(scheduled(p, t)) for p, t in zip(plan, texts, strict=True)]
        _, pending = await asyncio.wait(tasks, timeout=opts.max_duration_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
    results = []
    for p, task in zip(plan, tasks, strict=True):
        if task.cancelled() or task.exception() is not None:
            results.append(RequestResult(p.position, "failed", p.send_at_s, p.send_at_s,
                                         len(p.input_ids), p.output_tokens,
                                         error="not sent before the replay's max duration"))
        else:
            results.append(task.result())
    return results, wall


def replay(plan: Sequence[PlannedRequest], router_url: str | Sequence[str], opts: ClientOptions,
           slo: SloTargets, kv_bytes: int | None = None, progress: bool = True,
           label: str = "replay") -> ReplayReport:
    """Synchronous wrapper with an optional progress bar (stderr)."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(plan), desc=label, unit="req", file=sys.stderr, leave=False)
    counts = {"ok": 0, "rejected": 0, "failed": 0}

    def done(r: RequestResult) -> None:
        counts[r.status] = counts.get(r.status, 0) + 1
        if bar is not None:
            bar.set_postfix(counts, refresh=False)
            bar.update(1)

    try:
        results, wall = asyncio.run(run_replay(plan, router_url, opts, done))
    finally:
        if bar is not None:
            bar.close()
    return ReplayReport(results, summarize(results, slo, wall, kv_bytes))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radix-global replay", description=__doc__.splitlines()[0])
    p.add_argument("trace", help="Mooncake-format JSONL trace")
    p.add_argument("--router", required=True, help="base URL of the router (or one worker)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N lines")
    p.add_argument("--conversations", type=int, default=None, metavar="K",
                   help="replay the turns of the first K multi-turn conversations")
    p.add_argument("--min-turns", type=int, default=3, help="with --conversations")
    p.add_argument("--duration-s", type=float, default=None,
                   help="set --time-scale so the replay's sends span this many seconds")
    p.add_argument("--tokens-per-hash-id", type=int, default=None,
                   help="tokens per Mooncake block (default: chosen for --target-mean-prompt)")
    p.add_argument("--target-mean-prompt", type=int, default=2048)
    p.add_argument("--page-size", type=int, default=16, help="round tokens per block to this")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply trace times by this (0.5 = twice as fast)")
    p.add_argument("--output-scale", type=float, default=0.05)
    p.add_argument("--max-output-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=6144)
    p.add_argument("--ttft-slo-s", type=float, default=SloTargets.ttft_s)
    p.add_argument("--tbt-slo-s", type=float, default=SloTargets.tbt_s)
    p.add_argument("--request-timeout-s", type=float, default=ClientOptions.request_timeout_s)
    p.add_argument("--max-duration-s", type=float, default=ClientOptions.max_duration_s)
    p.add_argument("--model", default=None, help='send "model" with each request')
    p.add_argument("--endpoint", choices=[e.value for e in Endpoint], default="generate",
                   help="SGLang /generate (default) or OpenAI /v1/completions (same prompt text)")
    p.add_argument("--model-path", default=None,
                   help="model folder: checks the tokenizer round trip, KV bytes per token")
    p.add_argument("--kv-dtype-bytes", type=int, default=4)
    p.add_argument("--out", default=None, help="JSON file for config + summary + requests")
    p.add_argument("--no-progress", action="store_true")
    return p


def plan_from_args(args: argparse.Namespace) -> tuple[list[PlannedRequest], ReplayScaling]:
    trace = list(read_trace(args.trace))
    if args.conversations:
        trace = select_conversations(trace, args.conversations, args.min_turns)
    trace = trace[: args.limit] if args.limit else trace
    if not trace:
        raise PlanError("no requests selected from the trace")
    time_scale = time_scale_for(trace, args.duration_s) if args.duration_s else args.time_scale
    tpb = args.tokens_per_hash_id or choose_tokens_per_hash_id(
        trace, args.target_mean_prompt, args.page_size, args.max_prompt_tokens)
    scaling = ReplayScaling(tpb, time_scale, args.output_scale, args.max_output_tokens,
                            args.max_prompt_tokens)
    return plan_requests(trace, scaling), scaling


def describe_plan(plan: Sequence[PlannedRequest], scaling: ReplayScaling) -> dict[str, Any]:
    n = max(1, len(plan))
    return {"requests": len(plan), "scaling": asdict(scaling),
            "mean_prompt_tokens": sum(len(p.input_ids) for p in plan) / n,
            "mean_output_tokens": sum(p.output_tokens for p in plan) / n,
            "duration_s": plan[-1].send_at_s if plan else 0.0,
            "ideal_prefix_tokens": shared_prefix_tokens(plan, scaling.tokens_per_hash_id)}


def format_summary(s: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        v = s.get(key)
        return "-" if v is None else f"{v * 1000:.0f} ms"

    return (f"requests {s['requests']} ok {s['ok']} rejected {s['rejected']} failed {s['failed']}"
            f"\nTTFT mean {ms('ttft_mean_s')} p50 {ms('ttft_p50_s')} p90 {ms('ttft_p90_s')} "
            f"p99 {ms('ttft_p99_s')} | TBT p90 {ms('tbt_p90_s')}"
            f"\nSLO attainment {s['slo_attainment'] or 0:.1%} goodput "
            f"{s['goodput_rps'] or 0:.2f} req/s | prefix tokens reused "
            f"{s['prefix_tokens_reused']} ({s['prefix_reuse_fraction'] or 0:.1%}) | "
            f"pool tokens {s['pool_tokens_loaded']} bytes moved {s['bytes_moved']}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan, scaling = plan_from_args(args)
    except (OSError, TraceFormatError, PlanError) as exc:
        print(f"radix-global replay: {exc}", file=sys.stderr)
        return 2
    kv_bytes = None
    if args.model_path:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model_path)
        try:
            prompt_text(plan[0].input_ids, tok)
        except ValueError as exc:
            print(f"radix-global replay: {exc}", file=sys.stderr)
            return 2
        kv_bytes = kv_bytes_per_token(args.model_path, args.kv_dtype_bytes)
    described = describe_plan(plan, scaling)
    print(f"replay: {described['requests']} requests over {described['duration_s']:.1f} s; "
          f"{scaling.tokens_per_hash_id} tokens per hash id -> mean prompt "
          f"{described['mean_prompt_tokens']:.0f} tokens, mean output "
          f"{described['mean_output_tokens']:.1f} tokens (x{scaling.output_scale}, ignore_eos)")
    opts = ClientOptions(args.request_timeout_s, args.max_duration_s, args.model,
                         endpoint=Endpoint(args.endpoint))
    slo = SloTargets(args.ttft_slo_s, args.tbt_slo_s)
    report = replay(plan, args.router, opts, slo, kv_bytes, progress=not args.no_progress)
    print(format_summary(report.summary))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(
            {"config": {"trace": args.trace, "router": args.router, **described},
             "summary": report.summary, "requests": [r.to_json() for r in report.results]},
            indent=1))
        print(f"wrote {args.out}")
    return 0 if report.summary["ok"] > 0 or not plan else 1


if __name__ == "__main__":
    sys.exit(main())
