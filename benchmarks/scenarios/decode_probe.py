"""Fit the simulator's hardware profile (prefill and decode) from a running SGLang engine.

    python -m benchmarks.scenarios.decode_probe --url http://HOST:PORT [--batches 1 4 8]
        [--contexts 64 1024] [--sizes 256 512 1024 2048] [--output-tokens 48] [--out FILE]
    python -m benchmarks.scenarios.decode_probe --local     # this project's CPU engine

Measures on an engine nothing else sends to: the cold TTFT of new prompts of each ``--sizes``
(fitted as ``engine_probe.fit`` does: the ``[prefill]`` table), and the time between tokens of
``B`` new prompts of ``L`` tokens decoding together, for every ``B`` in ``--batches`` and ``L`` in
``--contexts``, fitted by least squares to the simulator's decode step
(``radix_global_tools/simulate/decode.py``)::

    step = step_fixed_s + step_per_request_s * B + step_per_context_token_s * S

with ``S`` the batch's mean summed context over the decode (``B x (L + output / 2)``). Prints the
``[prefill]`` and ``[decode]`` tables of a profile (``radix-global plan --hardware``) and writes
the measurements as JSON. ``kv_tokens_per_instance`` comes from the engine's ``/server_info``
(``max_total_num_tokens``). ``--local`` starts one of this project's CPU engines
(``benchmarks/data/pressure.toml``, ``ours``) and probes that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness.paths import REPO
from benchmarks.scenarios.engine_probe import fit, measure, prompts, send_at_once


async def decode_batch(url: str, ids_list: list[list[int]], output_tokens: int) -> float:
    """Every prompt at once; the median over them of (latency - TTFT) / (output - 1)."""
    results = await send_at_once(url, ids_list, output_tokens, "decode probe")
    return statistics.median(((r.latency_s or 0.0) - (r.ttft_s or 0.0)) / (output_tokens - 1)
                             for r in results)


def fit_decode(rows: list[dict[str, Any]], output_tokens: int) -> dict[str, float]:
    """Least squares of the step time over (batch, summed context); negative terms (noise on a
    flat curve) are dropped and the rest refitted, so the profile stays physical."""
    b = np.array([r["batch"] for r in rows], dtype=float)
    s = b * np.array([r["context"] + output_tokens / 2 for r in rows], dtype=float)
    t = np.array([r["step_s"] for r in rows])
    cols = {"step_fixed_s": np.ones_like(b), "step_per_request_s": b,
            "step_per_context_token_s": s}
    keep = list(cols)
    while True:
        coef, *_ = np.linalg.lstsq(np.stack([cols[k] for k in keep], axis=1), t, rcond=None)
        neg = [k for k, c in zip(keep, coef, strict=True) if c < 0 and k != "step_fixed_s"]
        if not neg:
            break
        keep.remove(neg[0])
    out = dict.fromkeys(cols, 0.0)
    out.update({k: float(c) for k, c in zip(keep, coef, strict=True)})
    return out


def probe(url: str, sizes: list[int], batches: list[int], contexts: list[int],
          output_tokens: int) -> dict[str, Any]:
    info = httpx.get(f"{url}/server_info", timeout=30).json()
    kv_tokens = int(info.get("max_total_num_tokens") or 0)
    asyncio.run(measure(url, [[7 + i] * 64 for i in range(2)], 4))  # first-request costs
    cold = asyncio.run(measure(url, prompts(sizes, 3, seed=15), 2))
    rows = []
    seed = 30
    for ctx in contexts:
        for batch in batches:
            seed += 1
            step = asyncio.run(decode_batch(url, prompts([ctx], batch, seed), output_tokens))
            rows.append({"batch": batch, "context": ctx, "step_s": step})
            print(f"decode batch {batch} x {ctx} tokens: {step * 1000:.1f} ms/step", flush=True)
    return {"url": url, "kv_tokens_per_instance": kv_tokens, "prefill": cold,
            "prefill_fit": fit(cold), "decode": rows,
            "decode_fit": fit_decode(rows, output_tokens)}


def profile_tables(res: dict[str, Any]) -> str:
    p, d = res["prefill_fit"], res["decode_fit"]
    return "\n".join([
        "[prefill]",
        *(f"{k} = {v:.4g}" for k, v in p.items()),
        "",
        "[decode]",
        f"first_token_s = {d['step_fixed_s'] + d['step_per_request_s']:.4g}",
        *(f"{k} = {v:.4g}" for k, v in d.items()),
        f"kv_tokens_per_instance = {res['kv_tokens_per_instance']}",
    ])


def probe_local(args: argparse.Namespace) -> dict[str, Any]:
    """Start one of this project's CPU engines (pressure.toml's, without a router), probe it."""
    from benchmarks.scenarios.pressure_bench import engine_specs
    from benchmarks.scenarios.pressure_plan import DEFAULT_CONFIG, load_config
    from radix_global_tools.cluster.local import LocalCluster

    model_dir = str(REPO / "build" / "tiny-llama")
    run_dir = REPO / "build" / f"decode-probe-{time.strftime('%Y%m%d-%H%M%S')}"
    with LocalCluster(run_dir) as cluster:
        spec = replace(engine_specs(load_config(DEFAULT_CONFIG), model_dir, "/dev/shm")
                       ["stock-hicache"], n=1)
        engines = cluster.start_engines(spec, None, tag="probe-")
        try:
            return probe(engines.urls[0], args.sizes, args.batches, args.contexts,
                         args.output_tokens)
        finally:
            cluster.stop_engines(engines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.decode_probe",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running SGLang engine nothing else sends to")
    where.add_argument("--local", action="store_true", help="start this project's CPU engine")
    p.add_argument("--sizes", nargs="+", type=int, default=[256, 512, 1024, 2048])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 4, 8])
    p.add_argument("--contexts", nargs="+", type=int, default=[64, 1024])
    p.add_argument("--output-tokens", type=int, default=48)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "decode_probe.json"))
    args = p.parse_args(argv)
    if min(args.batches) < 1 or min(args.contexts) < 1 or args.output_tokens < 2 \
            or len(set(args.batches)) * len(set(args.contexts)) < 3:
        p.error("batches and contexts >= 1 (three points at least), --output-tokens >= 2")
    res = probe_local(args) if args.local else probe(
        args.url, args.sizes, args.batches, args.contexts, args.output_tokens)
    res["command"] = " ".join(["python -m benchmarks.scenarios.decode_probe", *(argv or
                                                                                 sys.argv[1:])])
    print(profile_tables(res))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
