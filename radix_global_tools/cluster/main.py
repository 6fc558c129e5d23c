"""``radix-global cluster up --hosts N``: a radix-global cluster over N test hosts of this machine.

Each worker host (``w1`` .. ``wN``) runs one real SGLang CPU worker through ``radix-global
sglang`` with its own shm pool (``--pool mooncake``: a Mooncake Store whose master runs on host
``m``, every worker contributing a segment); host ``r`` runs the router; with ``--index`` host
``i`` runs the standalone index service and the router uses it. The hosts are network
namespaces joined by a bridge (``radix_global_tools/cluster/hosts.py``), so everything between the
parts crosses a link; nothing listens on this machine's own network. The command prints the hosts
and how to reach the router (from inside host ``r``: ``ip netns exec <r's namespace> curl
...``), then waits for Ctrl-C (or ``--duration``); on exit, error or signal it stops every
process and removes the namespaces.
``--check`` sends a two-turn conversation through the router instead of waiting and prints where
it landed and what the engine had cached (exit 1 when the second turn missed its history).
``--replay TRACE`` runs ``radix-global replay`` from host ``r`` against the router (a trace
replay across hosts, ``--link-mbit`` for a slow network) and prints and records the bytes every
host's link carried: what the cluster puts on the network per request.
``radix-global cluster down`` removes the namespaces a crashed earlier run left behind.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from radix_global.trace import synthetic_word
from radix_global_tools.cluster.host_cluster import INDEX_PORT, HostCluster, HostProc
from radix_global_tools.cluster.hosts import HostSet
from radix_global_tools.cluster.local import MAX_ENGINES, ClusterError
from radix_global_tools.cluster.netns import HostError, remove_stale
from sglang_patch.make_model import ensure_model

DEFAULT_MODEL = "build/tiny-llama"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radix-global cluster",
                                description="a cluster over test hosts (network namespaces)")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start hosts, workers and router; wait for Ctrl-C")
    up.add_argument("--hosts", type=int, default=2, help=f"worker hosts, 1..{MAX_ENGINES}")
    up.add_argument("--model", default=DEFAULT_MODEL, help="model folder (built if missing)")
    up.add_argument("--index", action="store_true", help="standalone index service on host i")
    up.add_argument("--pool", choices=["shm", "mooncake"], default="shm",
                    help="L3 pool: each host's own shm, or a Mooncake Store (master on host m)")
    up.add_argument("--link-mbit", type=float, default=None,
                    help="shape every worker host's link to this bandwidth (tc tbf)")
    up.add_argument("--run-dir", default="build/cluster", help="logs go here")
    up.add_argument("--check", action="store_true", help="send one conversation, then exit")
    up.add_argument("--replay", default=None, metavar="TRACE",
                    help="replay a trace from host r (radix-global replay), print the link "
                         "bytes per host, write --out, then exit")
    up.add_argument("--replay-args", default="--conversations 4 --min-turns 3 --duration-s 40 "
                    "--target-mean-prompt 1024 --output-scale 0.05 --max-output-tokens 32",
                    help="more radix-global replay arguments (one string)")
    up.add_argument("--out", default="benchmarks/results/hosts_replay.json")
    up.add_argument("--duration", type=float, default=3600.0, help="stop after this many s")
    sub.add_parser("down", help="remove the hosts of crashed earlier runs")
    return p


def _conversation_check(c: HostCluster, router: HostProc) -> bool:
    words = " ".join(synthetic_word(i * 7) for i in range(200))
    messages = [{"role": "system", "content": words}, {"role": "user", "content": "hello"}]
    landed: list[tuple[str, int, int]] = []
    for turn in range(2):
        r = c.request("POST", router.url + "/v1/chat/completions", timeout=240.0, json={
            "model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0})
        r.raise_for_status()
        usage = r.json()["usage"]
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        landed.append((r.headers["x-radix-worker"], int(r.headers["x-radix-prefix-tokens"]),
                       cached))
        print(f"turn {turn}: worker {landed[-1][0]}, predicted prefix {landed[-1][1]} tokens, "
              f"engine cached {cached} of {usage['prompt_tokens']}", flush=True)
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        time.sleep(1.0)  # the turn's KV events reach the index
    return landed[1][0] == landed[0][0] and landed[1][2] > 0


def _replay(hosts: HostSet, c: HostCluster, router: HostProc, args: Any) -> int:
    """``radix-global replay`` in host r; the bytes each host's link carried meanwhile."""
    before = {h: hosts.bytes(h) for h in hosts.hosts}
    trace_out = Path(args.out).with_suffix(".requests.json")
    argv = hosts.argv("r", [sys.executable, "-m", "radix_global_cli", "replay", args.replay,
                            "--router", router.url, "--model-path", c.model_dir,
                            "--no-progress", "--out", str(trace_out),
                            *shlex.split(args.replay_args)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    print(done.stdout, done.stderr[-2000:] if done.returncode else "", sep="", flush=True)
    after = {h: hosts.bytes(h) for h in hosts.hosts}
    summary = json.loads(trace_out.read_text())["summary"] if trace_out.exists() else {}
    n = max(1, int(summary.get("requests") or 0))
    links = {h: {"rx": after[h].rx - before[h].rx, "tx": after[h].tx - before[h].tx}
             for h in hosts.hosts}
    print(f"{'host':<6}{'rx KiB':>10}{'tx KiB':>10}{'KiB/request':>13}")
    for h, b in links.items():
        print(f"{h:<6}{b['rx'] / 1024:>10.1f}{b['tx'] / 1024:>10.1f}"
              f"{(b['rx'] + b['tx']) / 1024 / n:>13.1f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "config": {"hosts": args.hosts, "link_mbit": args.link_mbit, "index": args.index,
                   "trace": args.replay, "replay_args": args.replay_args},
        "summary": summary, "link_bytes": links}, indent=1))
    print(f"wrote {args.out}")
    return done.returncode


def _print_hosts(hosts: HostSet, procs: list[HostProc], c: HostCluster) -> None:
    print(f"{'host':<6}{'namespace':<18}{'address':<14}{'runs':<13}{'url':<28}log")
    for p in procs:
        h = hosts[p.host]
        print(f"{p.host:<6}{h.netns:<18}{h.address:<14}{p.name:<13}{p.url:<28}{p.log_path}")
    r = hosts["r"]
    print(f"\nadmin token: {c.admin_token}\ntry: ip netns exec {r.netns} curl -s "
          f"{procs[0].url}/v1/chat/completions -H 'content-type: application/json' "
          """-d '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}'""",
          flush=True)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends the run like Ctrl-C: through the finally blocks that remove the hosts."""
    raise KeyboardInterrupt


def up(args: Any) -> int:
    if not 1 <= args.hosts <= MAX_ENGINES:
        print(f"radix-global cluster: --hosts must be 1..{MAX_ENGINES} (one engine each: at "
              "most that many on this machine)", file=sys.stderr)
        return 2
    ensure_model(args.model)
    workers = [f"w{i + 1}" for i in range(args.hosts)]
    names = [*workers, "r", *(["i"] if args.index else []),
             *(["m"] if args.pool == "mooncake" else [])]
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with HostSet(names, Path(args.run_dir)) as hosts:
            c = HostCluster(hosts, str(Path(args.model).resolve()), client_host="r")
            try:
                procs: list[HostProc] = []
                options: list[str] = []
                if args.index:
                    procs.append(c.start_index("i"))
                    options = ["--index", f"{hosts['i'].address}:{INDEX_PORT}"]
                router = c.start_router("r", options=options)
                procs.insert(0, router)
                master = c.start_mooncake_master("m") if args.pool == "mooncake" else None
                started = [c.start_worker(h, router, cores={n}, mooncake=master)
                           for n, h in enumerate(workers)]
                procs += started
                if args.link_mbit:
                    for h in workers:
                        hosts.shape(h, args.link_mbit)
                c.wait_http(started)
                c.wait_workers(router, {f"w-{h}" for h in workers})
                _print_hosts(hosts, [*procs, *(p for p in c.procs if p not in procs)], c)
                if args.check:
                    return 0 if _conversation_check(c, router) else 1
                if args.replay:
                    return _replay(hosts, c, router, args)
                print(f"\nrunning; Ctrl-C stops it (at most {args.duration:.0f} s)", flush=True)
                deadline = time.monotonic() + args.duration
                while time.monotonic() < deadline:
                    dead = [p for p in c.procs if p.popen.poll() is not None]
                    if dead:
                        raise ClusterError(f"{dead[0].host}/{dead[0].name} exited:\n"
                                           f"{dead[0].log_tail()}")
                    time.sleep(1.0)
                return 0
            finally:
                c.close()
    except KeyboardInterrupt:
        print("\nstopped; hosts removed", flush=True)
        return 0
    except (ClusterError, HostError) as exc:
        print(f"radix-global cluster: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "down":
        removed = remove_stale()
        print("removed: " + (", ".join(removed) if removed else "nothing"))
        return 0
    return up(args)


if __name__ == "__main__":
    sys.exit(main())
