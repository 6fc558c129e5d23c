"""An agent platform on real SGLang CPU workers: isolated tenants sharing a few long platform
prompts, with shared prefixes (``docs/interfaces.md``,
"Shared platform prefixes across isolated tenants") vs whole-request salts vs no isolation, in one
run over the same engines.

    python -m benchmarks.scenarios.shared_prompts_bench [--tenants 12] [--sessions 2] [--rate 2.0]
        [--repeats 3] [--out FILE]

Cluster (``radix_global_tools/cluster/local.py``): our router (conductor, a tenants file) and two of
our engines (one core each, one shm pool) that register with it. Workload (fixed by the seed): a few
platform prompts (tool schemas and instructions: ``PROMPT_TOKENS`` token ids each); every tenant
runs ``--sessions`` sessions of 3-6 turns over one of them; a turn adds a 48-token user message
to the conversation so far (the model's answers included), asks for 8 tokens, and is sent when
the one before it is answered. Sessions start open-loop (Poisson, ``--rate`` per second). Each
mode runs once per repeat (the order rotated), with tenants of its own (no cached alias answer
crosses runs), from flushed engines and an emptied pool:

- ``salts``: isolated tenants, no registered prefix (what the router did before);
- ``shared``: isolated tenants, the platform prompts registered;
- ``open``: tenants in the shared namespace (no isolation at all: the upper bound on reuse).

Reported per mode, median (min-max) over the repeats: TTFT mean / p90, delivered reuse
(engine-reported cached tokens over prompt tokens) and the tokens loaded from the pool. Table on
stdout, JSON to ``--out``; recorded in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.spread import median_spread, rotated, spread_text
from radix_global.trace import block_prompt
from radix_global_tools.cluster.local import EngineSet, LocalCluster, RouterSpec, flush_caches
from radix_global_tools.replay.client import stream_ids
from radix_global_tools.replay.stats import RequestResult, SloTargets, summarize

MODES = ("salts", "shared", "open")
PROMPT_TOKENS = (1536, 1024)
MESSAGE_TOKENS = 48
OUTPUT_TOKENS = 8


@dataclass(frozen=True)
class Workload:
    tenants: int = 12
    sessions: int = 2  # per tenant
    rate: float = 2.0  # sessions started per second (open loop)
    repeats: int = 3  # every mode once per repeat, the order rotated
    seed: int = 17


def platform_prompts() -> list[list[int]]:
    return [block_prompt([90_000 + 100 * i + b for b in range(n // 256)], 256)
            for i, n in enumerate(PROMPT_TOKENS)]


def sessions(w: Workload, group: str) -> list[tuple[float, str, int, list[list[int]]]]:
    """(start s, tenant, platform prompt, the user message of each turn), by start time; the
    messages are the same in every mode, the tenant names are the group's own (one group per
    mode and repeat: no alias answer a worker cached crosses from one to the next)."""
    rng = random.Random(w.seed)
    out, t = [], 0.0
    for s in range(w.tenants * w.sessions):
        t += rng.expovariate(w.rate)
        tenant = s % w.tenants
        turns = [block_prompt([7_000_000 + 1000 * s + k], MESSAGE_TOKENS)
                 for k in range(rng.randint(3, 6))]
        out.append((t, f"{group}-{tenant}", tenant % len(PROMPT_TOKENS), turns))
    return out


def tenants_file(w: Workload, path: Path) -> None:
    lines = []
    for mode in MODES:
        for r in range(w.repeats):
            for i in range(w.tenants):
                name = f"{mode}{r}-{i}"
                lines += [f'[tenants."{name}"]', f'api_keys = ["k-{name}"]',
                          f"shared = {'true' if mode == 'open' else 'false'}"]
    path.write_text("\n".join(lines) + "\n")


async def run_group(url: str, w: Workload, group: str, prompts: list[list[int]],
                   max_s: float = 600.0) -> tuple[list[RequestResult], float]:
    results: list[RequestResult] = []
    t0 = time.perf_counter()

    async def session(start: float, tenant: str, prompt: int, turns: list[list[int]],
                      client: httpx.AsyncClient) -> None:
        await asyncio.sleep(max(0.0, start - (time.perf_counter() - t0)))
        convo = list(prompts[prompt])
        for message in turns:
            convo += message
            result, answer = await stream_ids(client, url, convo, OUTPUT_TOKENS, len(results),
                                              t0, {"Authorization": f"Bearer k-{tenant}"})
            results.append(result)
            if result.status != "ok":
                return
            convo += answer

    async with httpx.AsyncClient(timeout=300) as client:
        tasks = [session(*s, client) for s in sessions(w, group)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=max_s)
    return results, time.perf_counter() - t0


def reset(engines: list[str]) -> None:
    """Flushed engines (device and host caches) and an emptied pool (SGLang's storage clear)."""
    if flush_caches(engines):
        raise RuntimeError("an engine refused /flush_cache")
    r = httpx.post(engines[0] + "/hicache/storage-backend/clear", timeout=60)
    r.raise_for_status()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.shared_prompts_bench")
    defaults = Workload()
    ap.add_argument("--tenants", type=int, default=defaults.tenants)
    ap.add_argument("--sessions", type=int, default=defaults.sessions)
    ap.add_argument("--rate", type=float, default=defaults.rate)
    ap.add_argument("--repeats", type=int, default=defaults.repeats)
    ap.add_argument("--model-dir", default=None, help="default: radix-global make-model's")
    ap.add_argument("--out", default="benchmarks/results/shared_prompts.json")
    args = ap.parse_args(argv)
    w = Workload(args.tenants, args.sessions, args.rate, args.repeats)
    if args.model_dir is None:
        from sglang_patch.make_model import cached_model

        args.model_dir = str(cached_model())
    prompts = platform_prompts()
    run_dir = Path(tempfile.mkdtemp(prefix="rg-shared-"))
    tenants_file(w, run_dir / "tenants.toml")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with LocalCluster(run_dir) as cluster:
        router = cluster.start_router(
            RouterSpec("ours", "conductor", {"--tenants-file": str(run_dir / "tenants.toml")}),
            None, model_dir=args.model_dir)
        engines = cluster.start_engines(EngineSet("ours", args.model_dir, n=2), router.url)
        cluster.wait_workers(router, 2)
        model = httpx.get(router.url + "/v1/models").json()["data"][0]["id"]
        for r in range(w.repeats):
            for mode in rotated(MODES, r):
                reset(engines.urls)
                if mode == "shared":
                    register(router.url, model, prompts)
                results, wall = asyncio.run(run_group(router.url, w, f"{mode}{r}", prompts))
                if mode == "shared":
                    for i in range(len(prompts)):
                        httpx.delete(f"{router.url}/admin/shared-prefixes/platform-{i}")
                runs[mode].append(summarize(results, SloTargets(), wall))
                print(f"repeat {r} {mode}: {len(results)} requests in {wall:.1f} s",
                      file=sys.stderr)
    report = {"workload": asdict(w), "prompt_tokens": list(PROMPT_TOKENS),
              "message_tokens": MESSAGE_TOKENS, "output_tokens": OUTPUT_TOKENS,
              "engines": 2, "runs": runs, "modes": {m: spread(rs) for m, rs in runs.items()}}
    print_table(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


def register(router: str, model: str, prompts: list[list[int]]) -> None:
    for i, ids in enumerate(prompts):
        httpx.post(router + "/admin/shared-prefixes", json={
            "name": f"platform-{i}", "model": model, "token_ids": ids}).raise_for_status()
    # backends that found no prefix registered ask again after 2 s (docs/interfaces.md,
    # "Shared platform prefixes across isolated tenants")
    time.sleep(2.5)


def spread(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Median (min-max) over the repeats of what the table shows."""
    out: dict[str, Any] = {}
    for key in ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "prefix_reuse_fraction",
                "pool_tokens_loaded", "ok"):
        values = [s[key] for s in summaries if s[key] is not None]
        out[key] = median_spread(values) if values else None
    return out


def print_table(report: dict[str, Any]) -> None:
    """Median (min-max) over the repeats."""
    cell = spread_text
    print(f"{'mode':7} {'TTFT mean s':>20} {'TTFT p90 s':>20} {'reuse':>20} {'from pool':>22}")
    for mode, s in report["modes"].items():
        print(f"{mode:7} {cell(s['ttft_mean_s'], '.3f'):>20} {cell(s['ttft_p90_s'], '.3f'):>20} "
              f"{cell(s['prefix_reuse_fraction'], '.1%'):>20} "
              f"{cell(s['pool_tokens_loaded'], '.0f'):>22}")


if __name__ == "__main__":
    raise SystemExit(main())
