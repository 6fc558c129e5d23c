"""What this build of Mooncake Store does with copies, on a live master across test hosts (the
ground of issue 44's fault-domain copies; docs/interfaces.md, "Mooncake Store as the L3 pool").

    python -m benchmarks.micro.mooncake_copies [--out benchmarks/results/mooncake_copies.json]

Hosts (``radix_global_tools/cluster/hosts.py``): ``m`` runs ``mooncake_master``; ``a``, ``b`` and
``c`` each run a client (this file with ``--client``) that contributes a 32 MiB segment and
answers one JSON op per stdin line. Each step prints what the store did, and whether that is what
was asked:

1. ``a`` puts an object with one replica preferred on its own segment: where is it?
2. ``a`` puts one preferred on ``b``'s segment (not its own): honoured?
3. ``a`` puts one with two replicas preferred on ``a`` and ``c``: where are they?
4. ``a`` asks ``create_copy_task`` to copy object 1 onto ``c``'s segment: does the task finish,
   and is there a second replica afterwards?
5. host ``a`` fails (processes killed, cable out); after Mooncake's client TTL ``b`` reads each
   object: which survived the loss of the host that wrote them?
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import REPO

SEGMENT = 32 << 20
SIZE = 1 << 20


def _where(store: Any, key: str) -> list[str]:
    """The transport endpoint of each memory replica of ``key``."""
    out = []
    for replica in store.get_replica_desc(key):
        if replica.is_memory_replica():
            desc = replica.get_memory_descriptor().buffer_descriptor
            out.append(str(desc.transport_endpoint))
    return out


def _answer(store: Any, op: dict[str, Any]) -> dict[str, Any]:
    from mooncake.store import ReplicateConfig

    if op["op"] == "hostname":
        return {"segment": str(store.get_hostname())}
    if op["op"] == "put":
        config = ReplicateConfig()
        config.replica_num = int(op["replicas"])
        config.preferred_segments = list(op["preferred"])
        rc = store.put(op["key"], bytes(SIZE), config)
        return {"rc": rc, "where": _where(store, op["key"]) if rc == 0 else []}
    if op["op"] == "copy":
        task, rc = store.create_copy_task(op["key"], list(op["targets"]))
        status: Any = None
        deadline = time.monotonic() + float(op.get("timeout_s", 20))
        while rc == 0 and time.monotonic() < deadline:
            response, qrc = store.query_task(task)
            status = str(response.status) if response is not None else f"query rc {qrc}"
            if response is not None and "PENDING" not in status and "PROCESSING" not in status:
                break
            time.sleep(0.2)
        return {"rc": rc, "status": status, "where": _where(store, op["key"])}
    if op["op"] == "get":
        value = store.get(op["key"])
        return {"size": len(value), "where": _where(store, op["key"]) if value else []}
    raise ValueError(f"unknown op {op['op']!r}")


def client(master: str, hostname: str) -> None:
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    if store.setup(hostname, "P2PHANDSHAKE", SEGMENT, SEGMENT, "tcp", "", master) != 0:
        raise SystemExit(f"setup against {master} failed")
    try:
        for line in sys.stdin:
            try:
                print(json.dumps(_answer(store, json.loads(line))), flush=True)
            except Exception as exc:  # one op's failure is that op's answer
                print(json.dumps({"error": repr(exc)}), flush=True)
    finally:
        store.close()


class Client:
    def __init__(self, hosts: Any, host: str, master: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.popen = subprocess.Popen(
            hosts.argv(host, [sys.executable, "-m", "benchmarks.micro.mooncake_copies",
                              "--client", master, hosts[host].address]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, **op: Any) -> dict[str, Any]:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps(op) + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"client exited ({self.popen.poll()}) on {op}")
        return dict(json.loads(line))


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--client"]:
        client(args_in[1], args_in[2])
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks.micro.mooncake_copies")
    ap.add_argument("--out", default="benchmarks/results/mooncake_copies.json")
    ap.add_argument("--ttl-wait-s", type=float, default=15.0,
                    help="after host a fails: Mooncake's client TTL (10 s) and some")
    args = ap.parse_args(args_in)
    from radix_global_tools.cluster.hosts import HostSet

    steps: list[dict[str, Any]] = []

    def step(name: str, asked: str, got: dict[str, Any], ok: bool) -> None:
        steps.append({"step": name, "asked": asked, "got": got, "as_asked": ok})
        print(f"{name:<34} {'yes' if ok else 'NO ':<4} {asked:<38} {json.dumps(got)}", flush=True)

    with HostSet(["m", "a", "b", "c"], tempfile.mkdtemp(prefix="rg-mooncake-copies-")) as hosts:
        master = f"{hosts['m'].address}:50051"
        hosts.spawn("m", "master", [str(Path(sys.executable).parent / "mooncake_master"),
                                    "--rpc_port=50051", "--metrics_port=9003"])
        time.sleep(2.0)
        clients = {h: Client(hosts, h, master) for h in "abc"}
        seg = {h: c.ask(op="hostname")["segment"] for h, c in clients.items()}
        addr = {h: hosts[h].address for h in "abc"}

        def on(where: list[str]) -> list[str]:
            return sorted(h for h in "abc" for w in where if w.startswith(addr[h] + ":"))

        print(f"{'step':<34} {'ok':<4} {'asked':<38} got")
        a = clients["a"]
        got = a.ask(op="put", key="own", replicas=1, preferred=[seg["a"]])
        step("1 put, own segment preferred", "1 replica on a", got, on(got["where"]) == ["a"])
        got = a.ask(op="put", key="remote", replicas=1, preferred=[seg["b"]])
        step("2 put, another segment preferred", "1 replica on b", got,
             on(got["where"]) == ["b"])
        got = a.ask(op="put", key="two", replicas=2, preferred=[seg["a"], seg["c"]])
        step("3 put, 2 replicas preferred a, c", "replicas on a and c", got,
             on(got["where"]) == ["a", "c"])
        got = a.ask(op="copy", key="own", targets=[seg["c"]])
        step("4 create_copy_task own -> c", "replicas on a and c", got,
             got["rc"] == 0 and on(got["where"]) == ["a", "c"])
        hosts.fail("a")
        time.sleep(args.ttl_wait_s)
        for key in ("own", "remote", "two"):
            got = clients["b"].ask(op="get", key=key)
            survives = bool(got.get("size")) and "a" not in on(got.get("where", []))
            step(f"5 a failed: b reads {key!r}", "readable from b or c", got, survives)
        for h in "bc":
            clients[h].popen.stdin.close()  # type: ignore[union-attr]
            clients[h].popen.wait(timeout=30)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"segments": seg, "steps": steps}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
