"""Micro-benchmark: how far a router's index lags behind many engines' KV events (issue 39).

``--engines`` simulated SGLang engines (1,000) publish KV-event batches on real ZMQ XPUB sockets
(TCP on loopback) from one generator process, which stays off the index's core. This process runs
the router's own :class:`radix_global.subscriber.KVEventSubscriber` (one SUB per engine: frame
checks, sequence tracking, msgpack decode, the index update) into a ``GlobalIndex``. Every frame is
encoded before the clock starts and stamped with the time it is due, so a batch's *lag* is when
the index applied it minus when it was due: the generator's own lateness counts against us, and
is reported apart.

Workload: the Mooncake conversation trace, its requests dealt to the engines in turn, at the
trace's rate per instance (its 12,031 requests over 59 minutes were served by the paper's 16
instances, Fig. 5) times ``--load``, cut at ``--duration-s``. Per request one ``BlockStored`` of
the pages its engine did not hold (page size 64, 512 tokens per hash id; a tagged array with its
token ids, as SGLang sends it) and a ``BlockRemoved`` of the least recently used pages past
``--engine-pages``. Then a burst: every engine publishes ``--burst`` more batches at one instant.

    python -m benchmarks.micro.event_lag [--engines 1000] [--load 1] [--duration-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import resource
import statistics
import struct
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from benchmarks.harness.paths import FULL_TRACE, RESULTS
from benchmarks.micro.index_bench import NS, PAGE_SIZE, TOKENS_PER_HASH_ID, LruTier
from radix_global import events
from radix_global import keys as page_keying
from radix_global.event_lag import LagStats
from radix_global.index import GlobalIndex
from radix_global.ops import IndexOp, RemovePages, StorePages
from radix_global.registration import WorkerInfo
from radix_global.subscriber import KVEventSubscriber
from radix_global.trace import read_trace, synthesize_prompt
from radix_global.types import Location, PageKey, Tier, WorkerId

TOPIC = b"kv-events"
TRACE_INSTANCES = 16  # the paper's Fig. 5 cluster served the trace
TRACE_SECONDS = 59 * 60
Frame = tuple[float, int, int, bytes]  # due (s after start), engine, seq, payload


def _event(op: IndexOp, tokens: dict[PageKey, list[int]]) -> list[Any]:
    """The event as SGLang encodes it: a tagged array (its structs are ``array_like``)."""
    if isinstance(op, StorePages):
        return ["BlockStored", op.keys, op.parent, [t for k in op.keys for t in tokens[k]],
                PAGE_SIZE, None, "GPU"]
    assert isinstance(op, RemovePages)
    return ["BlockRemoved", op.keys, "GPU"]


def build_frames(engines: int, load: float, duration_s: float, engine_pages: int, burst: int,
                 trace: Path = FULL_TRACE) -> tuple[list[Frame], int]:
    """Every frame of the run, in due order, and the pages stored or removed by them."""
    rate_scale = engines / TRACE_INSTANCES * load  # the trace runs this much faster
    tiers = [LruTier(Location(WorkerId(f"e{i}"), 0, Tier.GPU), engine_pages)
             for i in range(engines)]
    seqs = [0] * engines
    frames: list[Frame] = []
    pages = 0
    last: list[list[list[Any]]] = [[] for _ in range(engines)]
    for n, req in enumerate(read_trace(trace)):
        due = req.timestamp_ms / 1000.0 / rate_scale
        if due > duration_s:
            break
        tokens = synthesize_prompt(req.hash_ids, req.input_length, TOKENS_PER_HASH_ID)
        tokens = tokens[: len(tokens) // PAGE_SIZE * PAGE_SIZE]
        keys = page_keying.page_keys(tokens, PAGE_SIZE)
        by_key = {k: tokens[i * PAGE_SIZE:(i + 1) * PAGE_SIZE] for i, k in enumerate(keys)}
        e = n % engines
        ops: list[IndexOp] = []
        tiers[e].admit(keys, ops)
        events = [_event(op, by_key) for op in ops]
        pages += sum(len(op.keys) for op in ops if isinstance(op, StorePages | RemovePages))
        if events:
            last[e] = events
            frames.append((due, e, seqs[e], msgspec.msgpack.encode([due, events, 0])))
            seqs[e] += 1
    at = duration_s + 1.0
    for e in range(engines):  # the burst: each engine sends its last batch again, renumbered
        for _ in range(burst if last[e] else 0):
            frames.append((at, e, seqs[e], msgspec.msgpack.encode([at, last[e], 0])))
            seqs[e] += 1
            pages += sum(len(ev[1]) for ev in last[e])
    frames.sort(key=lambda f: f[0])
    return frames, pages


def _generator(conn: Connection, engines: int, spec: dict[str, Any]) -> None:
    """The engines: bind, wait until each is subscribed, then send every frame when due."""
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, engines + 64)
    socks = []
    for _ in range(engines):
        s = ctx.socket(zmq.XPUB)
        s.setsockopt(zmq.SNDHWM, 0)  # the benchmark bounds the frames, not the socket
        s.bind("tcp://127.0.0.1:*")
        socks.append(s)
    conn.send([s.getsockopt_string(zmq.LAST_ENDPOINT) for s in socks])
    frames, pages = build_frames(engines, **spec)
    waiting = {s: i for i, s in enumerate(socks)}  # an XPUB hears its subscriber join
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    deadline = time.time() + 60
    while waiting and time.time() < deadline:
        for s, _ in poller.poll(200):
            s.recv()
            waiting.pop(s, None)
    conn.send((len(frames), pages, len(waiting)))
    t0 = conn.recv()
    late = []
    for due, e, seq, payload in frames:
        wait = t0 + due - time.time()
        if wait > 0:
            time.sleep(wait)
        socks[e].send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])
        late.append(time.time() - t0 - due)
    conn.send(late)
    conn.recv()
    ctx.destroy(linger=0)


class _Timed(KVEventSubscriber):
    """The router's subscriber, noting when each batch was applied against when it was due."""

    t0 = 0.0
    lags: list[float]

    def _apply(self, pub: Any, payload: bytes, live_from: str | None = None) -> bool:
        ok = super()._apply(pub, payload, live_from)
        # [due, events, rank]: msgpack array of 3 (0x93), then a float64 (0xcb)
        self.lags.append(time.time() - self.t0 - struct.unpack(">d", payload[2:10])[0])
        return ok


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    conn, child = mp.Pipe()
    spec = {"load": args.load, "duration_s": args.duration_s, "engine_pages": args.engine_pages,
            "burst": args.burst}
    gen = mp.get_context("fork").Process(target=_generator, args=(child, args.engines, spec))
    gen.start()
    endpoints = conn.recv()
    index = GlobalIndex()
    # the product's own lag metric on the same clock as the frames' stamps (seconds after t0)
    sub = _Timed(index, timeout_s=3600.0, wall_clock=lambda: time.time() - sub.t0)
    sub.lags = []
    for i, endpoint in enumerate(endpoints):
        await sub.add_worker(WorkerInfo(
            worker_id=f"e{i}", url=f"http://127.0.0.1:{i + 1}", model="bench", namespace=NS,
            page_size=PAGE_SIZE, kv_events_endpoint=endpoint))
    while not conn.poll():
        await asyncio.sleep(0.05)
    n_frames, pages, unsubscribed = conn.recv()
    followed = sum(sub.subscribed(WorkerId(f"e{i}")) for i in range(args.engines))
    sub.t0 = t0 = time.time() + 1.0
    conn.send(t0)
    cpu0 = time.process_time()
    end = t0 + args.duration_s + 1.0 + 60.0
    while len(sub.lags) < n_frames and time.time() < end:
        await asyncio.sleep(0.01)
    cpu = time.process_time() - cpu0
    late = conn.recv()
    conn.send("bye")
    gen.join(10)
    stats, held = sub.stats(), index.stats()
    await sub.close()
    steady = sub.lags[: len(sub.lags) - args.burst * followed]
    burst = sub.lags[len(steady):]
    return {
        "engines": args.engines, "followed": followed, "unsubscribed": unsubscribed,
        "load": args.load, "duration_s": args.duration_s, "frames": n_frames,
        "applied": len(sub.lags), "pages": pages, "index_pages": held.pages,
        "ops_applied": stats.ops_applied, "gaps": stats.gaps,
        "steady_lag_ms": {q: 1e3 * _pct(steady, p) for q, p in
                          (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},
        "burst_lag_ms": {q: 1e3 * _pct(burst, p) for q, p in
                         (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},
        "generator_late_ms_p99": 1e3 * _pct(late, 0.99),
        "cpu_s": cpu, "pages_per_cpu_s": pages / cpu if cpu else None,
        "refused": {**stats.refused, **held.refused},
        "mean_lag_ms": 1e3 * statistics.mean(steady) if steady else None,
        "metric_check": _metric_check(stats.lag, sub.lags),
    }


def _metric_check(lag: LagStats | None, exact: list[float]) -> dict[str, Any]:
    """The subscriber's own lag histogram (``radix_global_kv_event_lag_seconds``) against the
    lags this benchmark measured itself: the share of batches within each of a few bounds. The
    metric is taken as a batch is decoded, the benchmark's after it was applied: the metric's
    shares may be a little higher, never lower by more than the batches still in flight."""
    if lag is None or not exact:
        return {}
    out: dict[str, Any] = {"metric_batches": sum(lag.counts), "measured_batches": len(exact)}
    for bound in (0.01, 0.1, 1.0):
        within = sum(lag.counts[: lag.bounds_s.index(bound) + 1])
        out[f"within_{bound:g}s"] = {"metric": within / max(1, sum(lag.counts)),
                                     "measured": sum(x <= bound for x in exact) / len(exact)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--engines", type=int, default=1000)
    ap.add_argument("--load", type=float, default=1.0, help="x the trace's rate per instance")
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--engine-pages", type=int, default=1024,
                    help="pages each engine holds before it evicts (64 tokens a page)")
    ap.add_argument("--burst", type=int, default=1, help="batches each engine sends at once")
    ap.add_argument("--whole-decode", action="store_true",
                    help="decode every batch whole, token ids included (the reference decoder, "
                         "as before token ids were left undecoded)")
    ap.add_argument("--json", type=Path, default=RESULTS / "event_lag.json")
    args = ap.parse_args()
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * args.engines + 256:
        raise SystemExit(f"open files limit {soft} is too low for {args.engines} engines "
                         f"(ulimit -n {4 * args.engines + 256})")
    if args.whole_decode:
        events._envelope = lambda payload, decoder: decoder.decode(payload)
    res = asyncio.run(run(args))
    res["whole_decode"] = args.whole_decode
    print(json.dumps(res, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
