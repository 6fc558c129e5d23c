"""Several routers, one view (issue 38): throughput and router CPU of 1, 2 and 3 routers, and how
late one router sees another's work.

Part 1, on instant upstreams (``benchmarks/harness/instant_upstream.py``, K processes): N routers
(``radix-global router --policy conductor``, each its own process, same options, the same
``--workers``; for N >= 2 the same Redis through ``--coordination``, N = 1 alone, without Redis)
and a lean client (this process, asyncio streams, httptools) keeping ``--concurrency``
connections busy, connection i on router i mod N, until ``--requests`` answers or ``--seconds``.
Per configuration: requests/s, median and p90 latency, the routers' CPU seconds (user + system,
from /proc, all router processes summed) per request, and its ratio to one router's (target
<= 1.1x). Each configuration is measured ``--rounds`` times, fresh processes each time, the order
rotated per round; the spread is the rounds' median (min-max). Before each batch the routers'
CPU while idle is read too (background timers: publishing, resync), per router and second,
after the routers went quiet (a started router loads its tokenizer in the background).
Every router runs with ``--engine-load-poll-s 0`` (instant upstreams serve no load report).
``--smg`` adds the peer gateway the same way: smg 1.13 (``cache_aware``) alone, and 2 smg
routers joined by its mesh (``--enable-mesh``, SWIM gossip and CRDTs, on loopback); their ratio
is to smg alone.

Part 2, two routers A and B on holding upstreams (in this process: ``/generate`` answers only when
released): one streamed request through A, then B's ``/admin/stats`` (``coordination.peer_load``)
polled until A's work shows there. Delay = that answer's arrival - the request's arrival at the
upstream (an upper bound, by one poll). Also how late it leaves B's view after the answer, and the
size of A's ``rg:<cluster>:load:a`` record in Redis with K requests in flight.

Run: ``python -m benchmarks.micro.router_replicas`` (table +
``benchmarks/results/router_replicas.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.instant_upstream import upstream_app
from benchmarks.harness.lean_client import exchange, run_batch
from benchmarks.harness.paths import RESULTS
from benchmarks.harness.spread import median_spread, rotated, spread_text
from benchmarks.micro.router_overhead import cpu_s, pct, spawn, stop, wait_ready
from radix_global_tools.cluster.local import RouterSpec, router_argv
from router.coordination.config import CoordinationConfig
from sglang_patch.ports import free_port

RESULT = RESULTS / "router_replicas.json"
TARGET_CPU_RATIO = 1.1
CONFIGS = ("1", "2", "3")  # routers; 2 and 3 share one Redis
CONTROL = "3-alone"  # --control: 3 routers without Redis (more processes, no coordination)
SMG = ("smg", "smg-2-mesh")  # --smg: smg 1.13 (cache_aware) alone, and 2 joined by its mesh
ROUTER_IDS = "abc"  # --coordination-router-id of the routers, in order


def ratios(cpu_per_request: dict[str, float]) -> dict[str, float | None]:
    """Each configuration's CPU per request over one router's of its kind (ours: ``1``; smg:
    ``smg``); None without a positive base."""
    def base(n: str) -> float | None:
        return cpu_per_request.get(SMG[0] if n in SMG else "1")

    return {n: (v / b if (b := base(n)) else None) for n, v in cpu_per_request.items()}


async def run_spread(bases: list[str], path: str, body: dict[str, Any], concurrency: int,
                     total: int, seconds: float) -> tuple[list[float], float]:
    """At most ``total`` POSTs, none started after ``seconds``, from ``concurrency`` keep-alive
    connections, connection i to ``bases[i % len(bases)]``: each answer's latency, the wall time."""
    payload = json.dumps(body).encode()
    lat: list[float] = []
    left = [total]
    deadline = time.perf_counter() + seconds

    async def worker(base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        request = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: "
                   f"application/json\r\ncontent-length: {len(payload)}\r\n\r\n").encode() + payload
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while left[0] > 0 and time.perf_counter() < deadline:
                left[0] -= 1
                lat.append(await exchange(reader, writer, request, f"{base}{path}"))
        finally:
            writer.close()

    t0 = time.perf_counter()  # connection set-up counted: the same for every configuration
    await asyncio.gather(*(worker(bases[i % len(bases)]) for i in range(concurrency)))
    return lat, time.perf_counter() - t0


def start_routers(n: int, workers: list[str], redis_url: str | None, work: Path,
                  args: argparse.Namespace, tag: str) -> list[tuple[str, Any]]:
    """``n`` routers (base URL, process), each named by letter (a, b, ...) among its peers."""
    out = []
    for i in range(n):
        port, rid = free_port(), ROUTER_IDS[i]
        cmd = [sys.executable, "-m", "radix_global_cli", "router", "--workers", *workers,
               "--policy", "conductor", "--port", str(port), "--log-level", "warning",
               "--engine-load-poll-s", "0"]  # instant upstreams report no load (/v1/loads)
        if redis_url is not None:
            cmd += ["--coordination", redis_url, "--coordination-router-id", rid,
                    "--coordination-load-publish-s", str(args.load_publish_s)]
        out.append((f"http://127.0.0.1:{port}", spawn(cmd, work / f"router-{tag}-{rid}.log")))
    return out


def start_smg(n: int, workers: list[str], work: Path, tag: str) -> list[tuple[str, Any]]:
    """``n`` smg routers (``cache_aware``); for n >= 2 joined by its mesh (gossip on loopback,
    every node given the others as peers)."""
    mesh = [free_port() for _ in range(n)]
    out = []
    for i in range(n):
        port = free_port()
        cmd = router_argv(RouterSpec("smg", "cache_aware"), port, workers, "")
        if n > 1:
            cmd += ["--enable-mesh", "--mesh-server-name", f"smg-{i}", "--mesh-host",
                    "127.0.0.1", "--mesh-port", str(mesh[i]), "--mesh-peer-urls",
                    *(f"127.0.0.1:{p}" for j, p in enumerate(mesh) if j != i)]
        out.append((f"http://127.0.0.1:{port}", spawn(cmd, work / f"smg-{tag}-{i}.log")))
    return out


def throughput(args: argparse.Namespace, model: Path, work: Path, redis: Any,
               path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    ups = [free_port() for _ in range(args.workers)]
    procs = [spawn([sys.executable, "-m", "benchmarks.harness.instant_upstream", "--port",
                    str(p), "--model-path", str(model)], work / f"upstream-{p}.log") for p in ups]
    workers = [f"http://127.0.0.1:{p}" for p in ups]
    configs = [*CONFIGS, *([CONTROL] if args.control else []), *(SMG if args.smg else ())]
    per: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    try:
        for w in workers:
            wait_ready(f"{w}/generate", {"input_ids": [1]})
        for r in range(args.rounds):
            for c in rotated(configs, r):
                redis.client().flushall()
                if c in SMG:
                    n = 2 if c == SMG[1] else 1
                    routers = start_smg(n, workers, work, f"r{r}c{c}")
                else:
                    n, shared = int(c[0]), c in CONFIGS and c != "1"
                    routers = start_routers(n, workers, redis.url if shared else None, work,
                                            args, f"r{r}c{c}")
                try:
                    for base, _ in routers:
                        wait_ready(f"{base}{path}", body)
                        asyncio.run(run_batch(base, path, body, 4, 100))  # warm up
                    pids = [proc.pid for _, proc in routers]
                    settle(pids, args.settle_s)
                    i0 = sum(cpu_s(p) for p in pids)
                    time.sleep(args.idle_s)  # background work alone (timers, publishing)
                    c0 = sum(cpu_s(p) for p in pids)
                    lat, wall = asyncio.run(run_spread([b for b, _ in routers], path, body,
                                                       args.concurrency, args.requests,
                                                       args.seconds))
                    cpu = sum(cpu_s(p) for p in pids) - c0
                finally:
                    for _, proc in routers:
                        stop(proc)
                per[c].append({"requests": len(lat), "rps": len(lat) / wall,
                               "median_ms": statistics.median(lat) * 1e3,
                               "p90_ms": pct(lat, 0.90) * 1e3, "cpu_ms": cpu / len(lat) * 1e3,
                               "idle_cpu_ms_per_s": (c0 - i0) / args.idle_s / n * 1e3})
                print(f"round {r}, routers {c}: " + ", ".join(
                    f"{k} {v:.3f}" for k, v in per[c][-1].items()), flush=True)
    finally:
        for proc in procs:
            stop(proc)
    rat = ratios({c: statistics.median(x["cpu_ms"] for x in per[c]) for c in configs})
    return [{"routers": c, "rounds": per[c],
             **{k: median_spread([x[k] for x in per[c]])
                for k in ("requests", "rps", "median_ms", "p90_ms", "cpu_ms",
                          "idle_cpu_ms_per_s")},
             "cpu_ratio_vs_1": rat[c]} for c in configs]


class HoldUpstream:
    """K instant upstreams in a thread of this process whose ``/generate`` answers (one SSE
    event, then ``[DONE]``) only after :meth:`release`; each arrival's time is kept."""

    def __init__(self, model: Path, k: int) -> None:
        import uvicorn

        self.inner = upstream_app(str(model))
        self.socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(k)]
        self.urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in self.socks]
        self.arrivals: list[float] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.gate: asyncio.Event | None = None
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning",
                                                    access_log=False, lifespan="off",
                                                    interface="asgi3"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": self.socks},
                                       daemon=True)
        self.thread.start()

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/generate":
            return await self.inner(scope, receive, send)
        while (await receive()).get("more_body", False):
            pass
        self.loop = asyncio.get_running_loop()
        self.arrivals.append(time.monotonic())
        self.gate = self.gate or asyncio.Event()
        await self.gate.wait()
        event = json.dumps({"text": "ok", "meta_info": {"prompt_tokens": 1, "cached_tokens": 0}})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body",
                    "body": f"data: {event}\n\ndata: [DONE]\n\n".encode()})

    def release(self) -> None:  # every request held now answers; later ones wait again
        def open_gate() -> None:
            old, self.gate = self.gate, asyncio.Event()
            if old is not None:
                old.set()
        if self.loop is not None:
            self.loop.call_soon_threadsafe(open_gate)

    def close(self) -> None:
        self.release()
        self.server.should_exit = True
        self.thread.join(10)


def settle(pids: list[int], timeout: float, window: float = 0.5, quiet: float = 0.05) -> None:
    """Until each process uses under ``quiet`` of a core over ``window`` (a router loads its
    tokenizer in the background for seconds after it starts), at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = [cpu_s(p) for p in pids]
        time.sleep(window)
        if all(cpu_s(p) - b < quiet * window for p, b in zip(pids, before, strict=True)):
            return


def wait_for(fn: Any, timeout: float, poll: float) -> float | None:
    """Poll ``fn`` until true: the monotonic time of the true answer; None past ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return time.monotonic()
        time.sleep(poll)
    return None


def divergence(args: argparse.Namespace, model: Path, work: Path, redis: Any,
               ids: list[int]) -> dict[str, Any]:
    hold = HoldUpstream(model, args.workers)
    redis.client().flushall()
    routers = start_routers(2, hold.urls, redis.url, work, args, "div")
    (a, _), (b, _) = routers
    seen: list[float] = []
    cleared: list[float] = []
    polls: list[float] = []  # how long one read of B's /admin/stats took (the bound's slack)
    http = httpx.Client(timeout=10)
    raw = b""

    def peer_load() -> list[Any]:
        t = time.monotonic()
        stats = http.get(f"{b}/admin/stats").json()["coordination"]
        polls.append((time.monotonic() - t) * 1e3)
        return list(stats.get("peer_load", [])) if stats else []

    def send(n: int) -> list[threading.Thread]:  # n streamed requests to A, distinct prompts
        bodies = [{"input_ids": [i + 1, *ids], "stream": True,
                   "sampling_params": {"max_new_tokens": 1}} for i in range(n)]
        ts = [threading.Thread(target=lambda x=x: httpx.post(f"{a}/generate", json=x, timeout=30))
              for x in bodies]
        for t in ts:
            t.start()
        return ts

    def finish(ts: list[threading.Thread]) -> None:  # release until every answer is back
        deadline = time.monotonic() + 30
        while any(t.is_alive() for t in ts) and time.monotonic() < deadline:
            hold.release()
            for t in ts:
                t.join(0.05)

    try:
        for base, _ in routers:  # its workers known, its first read of the shared view done
            if wait_for(lambda base=base: _ready(http, base), 60, 0.2) is None:
                raise RuntimeError(f"{base} not ready (see the logs in {work})")
        for _ in range(args.trials):
            n = len(hold.arrivals)
            threads = send(1)
            wait_for(lambda n=n: len(hold.arrivals) > n, 10, 0.001)
            t_seen = wait_for(lambda: bool(peer_load()), 5, args.poll_s)
            t_release = time.monotonic()
            finish(threads)
            t_clear = wait_for(lambda: not peer_load(), 10, args.poll_s)
            if t_seen is not None and len(hold.arrivals) > n:
                seen.append((t_seen - hold.arrivals[n]) * 1e3)
            if t_clear is not None:
                cleared.append((t_clear - t_release) * 1e3)
        threads = send(args.workers)

        def record_full() -> bool:  # every request counted, routed or held by A's gate
            nonlocal raw
            raw = redis.client().get(f"rg:default:load:{ROUTER_IDS[0]}") or b""
            return sum(s[2] + s[6] for s in json.loads(raw or b"{}").get("slots", [])) \
                >= args.workers
        full = wait_for(record_full, 10, 0.02) is not None
        finish(threads)
    finally:
        http.close()
        for _, proc in routers:
            stop(proc)
        hold.close()
    return {"trials": args.trials, "poll_ms": args.poll_s * 1e3, "read_ms": summary(polls),
            "seen_ms": summary(seen), "cleared_ms": summary(cleared),
            "load_record": {"in_flight": args.workers, "complete": full, "bytes": len(raw),
                            "slots": len(json.loads(raw or b"{}").get("slots", []))}}


def summary(ms: list[float]) -> dict[str, float] | None:
    """Median, p90, max and count of a list of delays (None when empty)."""
    if not ms:
        return None
    return {"median": statistics.median(ms), "p90": pct(ms, 0.9), "max": max(ms), "n": len(ms)}


def fmt(v: dict[str, float] | None) -> str:
    return "never" if v is None else (f"median {v['median']:.1f} ms, p90 {v['p90']:.1f} ms, "
                                      f"max {v['max']:.1f} ms (n={v['n']:.0f})")


def _ready(http: httpx.Client, base: str) -> bool:
    try:
        stats = http.get(f"{base}/admin/stats").json()
    except (httpx.HTTPError, ValueError):
        return False
    return bool(stats.get("workers")) and bool((stats.get("coordination") or {}).get("synced"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4, help="instant upstream workers (K)")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--requests", type=int, default=3000, help="per configuration and round")
    p.add_argument("--seconds", type=float, default=60, help="time bound per batch")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trials", type=int, default=40, help="divergence trials (two routers)")
    p.add_argument("--poll-s", type=float, default=0.002, help="divergence poll period")
    p.add_argument("--settle-s", type=float, default=30,
                   help="at most this long, before each batch, for started routers to go quiet")
    p.add_argument("--idle-s", type=float, default=2,
                   help="before each batch: the routers' CPU while idle, over this long")
    p.add_argument("--load-publish-s", type=float, default=CoordinationConfig.load_publish_s,
                   help="--coordination-load-publish-s of every router (default: the router's)")
    p.add_argument("--control", action="store_true",
                   help=f"also {CONTROL}: 3 routers, each alone (no Redis), as a control")
    p.add_argument("--smg", action="store_true",
                   help=f"also {' and '.join(SMG)}: the peer gateway alone and 2 in its mesh")
    p.add_argument("--json", default=str(RESULT))
    args = p.parse_args(argv)

    from sglang_patch.make_model import main as make_model
    from tests.redis_server import RedisServer

    work = Path(tempfile.mkdtemp(prefix="router-replicas-"))
    model = work / "model"
    make_model([str(model)])
    ids = [(7 * i) % 500 + 1 for i in range(args.prompt_tokens)]
    body = {"model": "tiny", "input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
    redis = RedisServer(work).start()
    try:
        rows = throughput(args, model, work, redis, "/generate", body)
        div = divergence(args, model, work, redis, ids)
    finally:
        redis.kill()
    shutil.rmtree(work, ignore_errors=True)  # kept on failure: the routers' logs are there
    print(f"{'routers':>7} {'req/s':>18} {'median ms':>20} {'p90 ms':>20} "
          f"{'router cpu ms/req':>20} {'vs 1':>6} {'idle cpu ms/s/router':>20}")
    for r in rows:
        ratio = f"{r['cpu_ratio_vs_1']:.2f}x" if r["cpu_ratio_vs_1"] is not None else "-"
        print(f"{r['routers']:>7} {spread_text(r['rps'], '.0f'):>18} "
              f"{spread_text(r['median_ms'], '.2f'):>20} {spread_text(r['p90_ms'], '.2f'):>20} "
              f"{spread_text(r['cpu_ms'], '.3f'):>20} {ratio:>6} "
              f"{spread_text(r['idle_cpu_ms_per_s'], '.1f'):>20}")
    worst = max((r["cpu_ratio_vs_1"] or 0.0) for r in rows if r["routers"] in CONFIGS)
    met = worst <= TARGET_CPU_RATIO
    lines = [f"target: router CPU per request of 2-3 routers <= {TARGET_CPU_RATIO}x one "
             f"router's: worst {worst:.2f}x: {'MET' if met else 'MISSED'}",
             f"divergence, 2 routers: A's work seen by B {fmt(div['seen_ms'])} after it reached "
             f"the upstream; gone from B {fmt(div['cleared_ms'])} after the answer (poll "
             f"{div['poll_ms']:.0f} ms; one read of B's stats {fmt(div['read_ms'])}; "
             f"{div['trials']} trials); A's load record with "
             f"{div['load_record']['in_flight']} requests in flight: "
             f"{div['load_record']['bytes']} bytes, {div['load_record']['slots']} slots"]
    for line in lines:
        print(line)
    result = {"workers": args.workers, "prompt_tokens": args.prompt_tokens,
              "load_publish_s": args.load_publish_s, "concurrency": args.concurrency,
              "rounds": args.rounds,
              "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(), "rows": rows,
              "divergence": div, "target_met": met, "lines": lines,
              "command": " ".join(["python -m benchmarks.micro.router_replicas",
                                   *(argv or sys.argv[1:])])}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
