"""Is each peer configured as its users would run it? Second turns reach their history holder.

    python -m benchmarks.scenarios.peer_check [--routers NAME ...] [--conversations 5] [--out FILE]

Before a peer's TTFT means anything, its cache-aware mode must do what its users pick it for:
send a conversation's next turn to the engine that holds the conversation so far (issue 42's
check). Per router, on two real CPU SGLang engines whose caches were flushed:

1. the first turns of ``--conversations`` (odd) conversations, each its own prompt, go through the
   router overlapping (one started every ``stagger`` seconds, so they arrive in a fixed order
   while the earlier ones still load an engine);
2. then their second turns (the first turn's prompt and more), one after another, each reporting
   the prompt tokens its engine found cached;
3. then every engine is asked directly for each first turn: the engine that finds it cached is
   that conversation's *holder* (asked last, as a probe writes into the engine it asks; a
   second turn that missed left a copy where it ran, so a failing router shows two holders).

A router **passes** when every second turn found its history cached (at least half the first
turn) and the holders include both engines (one engine holding everything would prove nothing:
``not shown``). Round robin is the negative control: with an odd number of conversations arriving
in order, each second turn goes to the other engine, so it must **fail**.

The engines are plain SGLang with KV events and no HiCache or L3 tier (a shared tier would serve
another engine's history and hide where a request went): over HTTP for the HTTP routers, over
smg's gRPC protocol for smg's event-driven index. The routers are ``pressure_bench``'s, with the
same options, sent what it sends them (token ids to smg's hash index, text to the others). Table
on stdout, JSON (every request) to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from benchmarks.harness.paths import BUILD, RESULTS
from benchmarks.scenarios.bench import BenchConfig, Contender, Runner, machine, model_name
from benchmarks.scenarios.pressure_bench import CACHE_AWARE, CONTENDERS
from radix_global.trace import prompt_text, synthesize_prompt
from radix_global_tools.cluster import smg_grpc
from radix_global_tools.cluster.local import Engines, EngineSet, LocalCluster, RouterSpec
from sglang_patch.make_model import ensure_model

HTTP, GRPC = "http", "grpc"  # the engine sets (``Contender.engines``)


# What smg logs (at info) once a gRPC worker's KV-event stream is open: the proof that its
# event-driven index is fed (no flag turns it on; gRPC workers imply it).
EVENTS_CONNECTED = "KV event stream connected"


def _here(c: Contender) -> Contender:
    """pressure_bench's contender on this check's engines, named by its router part; over gRPC
    smg logs at info, for :data:`EVENTS_CONNECTED`."""
    name = c.name.split(" + ")[0]
    if not c.engines.endswith("grpc"):
        return replace(c, name=name, engines=HTTP)
    return replace(c, name=name, engines=GRPC,
                   router=replace(c.router, options={**c.router.options, "--log-level": "info"}))


# pressure_bench's cache-aware modes, as it runs them (options, token ids)
MODES = {c.name: c for c in (
    Contender("sglang-router cache_aware", HTTP, CACHE_AWARE),
    *(_here(c) for c in CONTENDERS
      if c.router.kind == "smg" and c.router.policy != "least_load"),
    Contender("ours conductor (pool off)", HTTP, RouterSpec("ours", "conductor")))}
NEGATIVE = {c.name: c for c in (
    Contender("sglang-router round_robin (control)", HTTP,
              RouterSpec("sglang-router", "round_robin")),
    Contender("smg round_robin over gRPC (control)", GRPC, RouterSpec("smg", "round_robin")))}
ROUTERS = {**MODES, **NEGATIVE}


class Turn(NamedTuple):
    conversation: int
    turn: int
    prompt_tokens: int
    cached_tokens: int | None  # None: the request failed
    error: str | None = None


def send(url: str, ids: list[int], model: str | None, max_new_tokens: int = 4,
         token_ids: bool = False) -> Turn:
    """One ``/generate`` of the prompt as text (as the benchmarks send it), or as its token ids."""
    body: dict[str, Any] = {"sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
    body.update({"input_ids": ids} if token_ids else {"text": prompt_text(ids)})
    if model is not None:
        body["model"] = model
    try:
        resp = httpx.post(url + "/generate", json=body, timeout=300.0)
        resp.raise_for_status()
        data = resp.json()
        meta = (data[0] if isinstance(data, list) else data)["meta_info"]
        return Turn(-1, -1, len(ids), int(meta["cached_tokens"]))  # none: an error, not a miss
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        return Turn(-1, -1, len(ids), None, f"{type(exc).__name__}: {str(exc)[:200]}")


def probe(engine_url: str, ids: list[int]) -> int | None:
    """The engine's own cached tokens for ``ids`` (straight to it, no router)."""
    if smg_grpc.is_grpc(engine_url):
        return smg_grpc.generate(engine_url, ids, 1, timeout_s=300.0)
    return send(engine_url, ids, None, max_new_tokens=1).cached_tokens


def check(router_url: str, engines: Engines, n: int, first_tokens: int, more_tokens: int,
          stagger_s: float, token_ids: bool = False) -> dict[str, Any]:
    """The check on a router in front of ``engines`` (two, caches empty): ``n`` conversations'
    first and second turns through it, then the probes; the verdict as :func:`judge` gives it."""
    model = model_name(engines)
    firsts = [synthesize_prompt([7_000_000 + 10 * i], first_tokens, first_tokens)
              for i in range(n)]
    turns: list[Turn] = []
    out: list[Turn | None] = [None] * n

    def first(i: int) -> None:
        out[i] = send(router_url, firsts[i], model, token_ids=token_ids)._replace(
            conversation=i, turn=1)

    threads = [threading.Thread(target=first, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    for t in threads:
        t.join()
    turns += [t or Turn(i, 1, len(firsts[i]), None, "no answer") for i, t in enumerate(out)]
    for i, ids in enumerate(firsts):
        more = synthesize_prompt([8_000_000 + 10 * i], more_tokens, more_tokens)
        turns.append(send(router_url, ids + more, model, token_ids=token_ids)._replace(
            conversation=i, turn=2))
    # Who holds each first turn, asked last: a probe writes into the engine it asks.
    cached = [[probe(url, ids) for url in engines.urls] for ids in firsts]
    return judge(turns, cached, first_tokens)


def judge(turns: list[Turn], cached: list[list[int | None]], first_tokens: int
          ) -> dict[str, Any]:
    """The verdict from the turns and the probes (``cached[conversation][engine]``, two
    engines): pass, fail, not shown (every history found, but one engine held them all) or
    error (a request or probe failed)."""
    enough = first_tokens // 2  # a hit finds the whole (page-aligned) first turn, a miss ~0
    holders = [[e for e, c in enumerate(row) if c is not None and c >= enough] for row in cached]
    n = len(cached)
    hits = sum(1 for t in turns if t.turn == 2 and (t.cached_tokens or 0) >= enough)
    spread = {e for h in holders for e in h}
    failed = any(t.cached_tokens is None for t in turns) or any(None in row for row in cached)
    verdict = ("error" if failed else "pass" if hits == n and len(spread) > 1
               else "not shown" if hits == n else "fail")
    return {"verdict": verdict, "second_turn_hits": hits, "conversations": n,
            "holders": holders, "probe_cached_tokens": cached,
            "turns": [t._asdict() for t in turns]}


def run(names: list[str], model_dir: str, run_dir: Path, n: int, first_tokens: int,
        more_tokens: int, stagger_s: float) -> list[dict[str, Any]]:
    """The check on each named router, one engine start-up per engine set; a row each."""
    plain = EngineSet("stock", model_dir, n=2)
    specs = {HTTP: plain, GRPC: replace(plain, grpc=True)}
    rows = []
    with LocalCluster(run_dir) as cluster:
        runner = Runner(cluster, BenchConfig(trace="", model_dir=model_dir), specs)
        for name in sorted(names, key=lambda k: ROUTERS[k].engines == GRPC):  # one start-up each
            c = ROUTERS[name]
            engines, router, info = runner.prepare(c)
            try:
                row = check(router.url, engines, n, first_tokens, more_tokens, stagger_s,
                            c.token_ids)
            finally:
                cluster.stop(router)
            if c.engines == GRPC and c.router.policy == "cache_aware":
                row["kv_events_connected"] = EVENTS_CONNECTED in router.log_path.read_text(
                    errors="replace")
                if row["verdict"] == "pass" and not row["kv_events_connected"]:
                    row["verdict"] = "not shown"  # it routed well, but not from the events
            rows.append({"router": name, "engines": c.engines, "spec": asdict(c.router),
                         "token_ids": c.token_ids, "control": name in NEGATIVE, **info, **row})
            print(line(rows[-1]), flush=True)
    return rows


def line(row: dict[str, Any]) -> str:
    """A row of the table ``main`` prints."""
    held = [len([h for h in row["holders"] if e in h]) for e in (0, 1)]
    return (f"| {row['router']} | {row['engines']} | {held[0]} / {held[1]} | "
            f"{row['second_turn_hits']} of {row['conversations']} | {row['verdict']} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=list(ROUTERS))
    p.add_argument("--conversations", type=int, default=5, help="odd: the control's premise")
    p.add_argument("--first-tokens", type=int, default=1024)
    p.add_argument("--more-tokens", type=int, default=256)
    p.add_argument("--stagger", type=float, default=0.1, help="seconds between first turns")
    p.add_argument("--model-dir", default=str(BUILD / "tiny-llama"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.conversations < 3 or args.conversations % 2 == 0:
        p.error("--conversations must be odd and at least 3 (round robin's premise)")
    ensure_model(args.model_dir)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = BUILD / f"peer-check-{stamp}"
    print("| router | engines | first turns held at the end by engine 0 / 1 | second turns that "
          "found their history | verdict |\n|---|---|---|---|---|", flush=True)
    rows = run(args.routers, args.model_dir, run_dir, args.conversations, args.first_tokens,
               args.more_tokens, args.stagger)
    out = args.out or RESULTS / f"peer_check-{stamp}.json"
    out.write_text(json.dumps({"machine": machine(), "args": vars(args) | {"out": str(out)},
                               "rows": rows}, indent=1, default=str))
    print(f"JSON: {out}")
    wrong = [r["router"] for r in rows if r["verdict"] != ("fail" if r["control"] else "pass")]
    if wrong:
        print(f"not as expected: {', '.join(wrong)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
