"""The standalone index service: ``radix-global index serve`` (gRPC, ``proto/index.proto``).

A thin async wrapper: every RPC is one call on :class:`ServiceState` (index + registry + feed) on
the server's event loop, so the single-owner index needs no locks. Errors become gRPC status codes
with a message and an ``rg-reason`` trailer (``wire.REFUSALS``): bad input INVALID_ARGUMENT,
unknown worker/namespace NOT_FOUND, page-size or id conflicts ALREADY_EXISTS, admin calls and key
queries without the token UNAUTHENTICATED, Snapshot without a path FAILED_PRECONDITION.

Who may call what, and with what bytes (issue 35), is :mod:`radix_global.service_guard`: it
refuses bytes that are no request message, and authorizes every write and every key query
(Match, HotPrefixes); Stats stays open.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import grpc
import msgspec

from radix_global.ops import (
    IndexRefusal,
    PageSizeMismatchError,
    UnknownNamespaceError,
)
from radix_global.proto import index_pb2 as pb
from radix_global.proto import index_pb2_grpc as pb_grpc
from radix_global.registration import (
    RegistrationError,
    decode_worker_info,
    refuse_host_local,
)
from radix_global.service_guard import RefuseMalformed, authorize, fail, is_loopback_peer
from radix_global.service_state import ServiceState, new_index, restore_index
from radix_global.shards import stats_dict
from radix_global.snapshot import (
    SnapshotError,
    SnapshotWritten,
    load_on_start,
    snapshot_every,
    write_now,
)
from radix_global.types import HolderId, Namespace, PageKey, WorkerId
from radix_global.wire import (
    IdConflictError,
    UnknownWorkerError,
    hot_to_pb,
    match_to_pb,
    op_from_pb,
    reason_of,
)

log = logging.getLogger(__name__)

MAX_TOP_K = 10_000
_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (UnknownWorkerError, grpc.StatusCode.NOT_FOUND),
    (UnknownNamespaceError, grpc.StatusCode.NOT_FOUND),
    (PageSizeMismatchError, grpc.StatusCode.ALREADY_EXISTS),
    (IdConflictError, grpc.StatusCode.ALREADY_EXISTS),
    (RegistrationError, grpc.StatusCode.INVALID_ARGUMENT),
    (IndexRefusal, grpc.StatusCode.INVALID_ARGUMENT),
    (SnapshotError, grpc.StatusCode.FAILED_PRECONDITION),
]


class ServiceConfig(msgspec.Struct, frozen=True):
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (the bound one is IndexServer.port)
    snapshot_path: str | None = None
    snapshot_interval_s: float = 0.0  # 0: snapshot only on Snapshot RPC and at shutdown
    start_empty_on_bad_snapshot: bool = False
    admin_token: str | None = None  # None: admin calls and key queries only from loopback
    shards: int = 1
    heartbeat_timeout_s: float = 20.0
    half_life_s: float | None = None  # hotness half-life; None: the index's default


class _Servicer(pb_grpc.GlobalIndexServiceServicer):
    def __init__(self, server: IndexServer) -> None:
        self._server = server

    @property
    def _state(self) -> ServiceState:
        return self._server.state

    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[[], Any],
                    admin: bool = False) -> Any:
        """Run ``fn`` and map its errors to status codes; ``admin``: only for an authorized
        caller (:meth:`_authorize`), which writes and key queries both need."""
        if admin:
            await self._authorize(context)
        try:
            result = fn()
            return (await result) if inspect.isawaitable(result) else result
        except Exception as exc:
            for kind, code in _CODES:
                if isinstance(exc, kind):
                    await fail(context, code, str(exc), reason_of(exc))
            log.exception("index service: unexpected error")
            await fail(context, grpc.StatusCode.INTERNAL, f"internal error: {exc!r}", "internal")

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        await authorize(context, self._server.config.admin_token)

    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.RegisterReply:
        async def register() -> pb.RegisterReply:
            info = decode_worker_info(request.worker_info_json)
            if not is_loopback_peer(context.peer()):
                refuse_host_local(info)
            return pb.RegisterReply(worker_id=info.worker_id,
                                    subscribed=await self._state.register(info))
        return await self._call(context, register, admin=True)

    async def Deregister(self, request: pb.WorkerRef, context: Any) -> pb.Ack:
        await self._call(context, lambda: self._state.deregister(WorkerId(request.worker_id)),
                         admin=True)
        return pb.Ack()

    async def Heartbeat(self, request: pb.WorkerRef, context: Any) -> pb.Ack:
        await self._call(context, lambda: self._state.heartbeat(WorkerId(request.worker_id)),
                         admin=True)
        return pb.Ack()

    async def Match(self, request: pb.MatchRequest, context: Any) -> pb.MatchReply:
        keys = [PageKey(k) for k in request.keys]
        ns = Namespace(request.namespace)
        # Authorized like a write: a hit on guessed keys confirms a tenant's prompt.
        return await self._call(
            context, lambda: match_to_pb(self._state.index.match(ns, keys, self._state.clock())),
            admin=True)

    async def Stats(self, request: pb.StatsRequest, context: Any) -> pb.StatsReply:
        def stats() -> pb.StatsReply:
            body = stats_dict(self._state.index.stats())
            body["service"] = self._state.service_stats() | self._server.snapshot_stats()
            return pb.StatsReply(stats_json=json.dumps(body).encode())
        return await self._call(context, stats)  # open: aggregate counts, no keys

    async def HotPrefixes(self, request: pb.HotPrefixesRequest, context: Any
                          ) -> pb.HotPrefixesReply:
        def hot() -> pb.HotPrefixesReply:
            if not 1 <= request.top_k <= MAX_TOP_K:
                raise IndexRefusal(f"top_k must be in [1, {MAX_TOP_K}], got {request.top_k}")
            ns = Namespace(request.namespace)
            return hot_to_pb(self._state.index.hot_prefixes(ns, request.top_k,
                                                            self._state.clock()))
        return await self._call(context, hot, admin=True)  # it lists page keys: as Match

    async def Snapshot(self, request: pb.SnapshotRequest, context: Any) -> pb.SnapshotReply:
        await self._authorize(context)
        try:
            written = await self._server.snapshot_now()
        except (SnapshotError, OSError) as exc:
            await fail(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc), "snapshot")
        return pb.SnapshotReply(path=written.path, size_bytes=written.size_bytes,
                                seconds=written.seconds)

    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyReply:
        def apply() -> pb.ApplyReply:
            reply = pb.ApplyReply()
            for msg in request.ops:
                try:
                    self._state.index.apply(op_from_pb(msg))
                    reply.applied += 1
                except IndexRefusal as exc:  # an op is an event: counted and dropped
                    reply.refused[exc.reason] += 1
            return reply
        return await self._call(context, apply, admin=True)

    async def RemoveHolder(self, request: pb.HolderRef, context: Any) -> pb.Ack:
        holder: HolderId = WorkerId(request.holder)
        await self._call(context, lambda: self._state.index.remove_holder(holder), admin=True)
        return pb.Ack()

    async def RegisterNamespace(self, request: pb.NamespaceRequest, context: Any) -> pb.Ack:
        def register() -> None:
            if "@" not in request.namespace or request.page_size < 1:
                raise IndexRefusal("need namespace '<model>@<version>' and page_size >= 1")
            self._state.index.register_namespace(Namespace(request.namespace), request.page_size)
        await self._call(context, register, admin=True)
        return pb.Ack()


class IndexServer:
    """One running index service: ``await IndexServer(config).start()``, then ``await stop()``."""

    def __init__(self, config: ServiceConfig) -> None:
        if config.shards < 1:
            raise ValueError(f"shards must be >= 1, got {config.shards}")
        self.config = config
        self.state = ServiceState(new_index(config.shards, config.half_life_s),
                                  config.heartbeat_timeout_s)
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._last_snapshot: SnapshotWritten | None = None

    async def start(self) -> IndexServer:
        cfg = self.config
        snap = None
        if cfg.snapshot_path:
            snap = load_on_start(cfg.snapshot_path, cfg.start_empty_on_bad_snapshot)
        if snap is not None:
            try:
                index = restore_index(snap.index, cfg.shards)
            except SnapshotError as exc:
                if not cfg.start_empty_on_bad_snapshot:
                    raise
                log.warning("ignoring snapshot (starting empty as asked): %s", exc)
            else:
                self.state = ServiceState(index, cfg.heartbeat_timeout_s)
                await self.state.restore_workers(snap.workers, snap.feeds)
                log.info("restored %s: %s", cfg.snapshot_path, stats_dict(index.stats()))
        self._server = grpc.aio.server(interceptors=[RefuseMalformed()])
        pb_grpc.add_GlobalIndexServiceServicer_to_server(_Servicer(self), self._server)
        self.port = self._server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        await self._server.start()
        period = max(0.05, min(1.0, cfg.heartbeat_timeout_s / 4))
        self._tasks.append(asyncio.create_task(self.state.subscriber.watch(period)))
        if cfg.snapshot_path and cfg.snapshot_interval_s > 0:
            self._tasks.append(asyncio.create_task(snapshot_every(
                cfg.snapshot_interval_s, cfg.snapshot_path, self.state.take_snapshot)))
        log.info("index service on %s:%d (%d shard(s))", cfg.host, self.port, cfg.shards)
        return self

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving, then write a last snapshot (when a path is configured). A background
        task that had failed is logged, never a reason to skip the snapshot."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("index service: background task %s had failed", task.get_name())
        self._tasks.clear()
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        try:
            if self.config.snapshot_path:
                await self.snapshot_now()
        finally:
            await self.state.subscriber.close()  # after the snapshot: closing drops the entries

    async def snapshot_now(self) -> SnapshotWritten:
        if not self.config.snapshot_path:
            raise SnapshotError("no snapshot path configured (--snapshot PATH)")
        self._last_snapshot = await write_now(self.config.snapshot_path, self.state.take_snapshot)
        return self._last_snapshot

    def snapshot_stats(self) -> dict[str, Any]:
        last = self._last_snapshot
        return {"snapshot_path": self.config.snapshot_path,
                "last_snapshot_bytes": last.size_bytes if last else None}


async def _serve_until_signal(config: ServiceConfig) -> None:
    server = await IndexServer(config).start()
    print(f"radix-global index: serving on {config.host}:{server.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radix-global index")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the standalone global index (gRPC)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=50051, help="0: any free port")
    serve.add_argument("--snapshot", metavar="PATH", help="restore on start, write on stop")
    serve.add_argument("--snapshot-interval", type=float, default=0.0, metavar="S",
                       help="also snapshot every S seconds (0: off)")
    serve.add_argument("--start-empty-on-bad-snapshot", action="store_true",
                       help="warn and start empty when the snapshot cannot be read")
    serve.add_argument("--admin-token", default=os.environ.get("RADIX_GLOBAL_ADMIN_TOKEN"),
                       help="token for admin calls and the key queries Match/HotPrefixes "
                       "(env RADIX_GLOBAL_ADMIN_TOKEN)")
    serve.add_argument("--shards", type=int, default=1, help="partition by chain head")
    serve.add_argument("--heartbeat-timeout", type=float, default=20.0, metavar="S")
    serve.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.shards < 1:
        parser.error("--shards must be >= 1")
    config = ServiceConfig(
        host=args.host, port=args.port, snapshot_path=args.snapshot,
        snapshot_interval_s=args.snapshot_interval,
        start_empty_on_bad_snapshot=args.start_empty_on_bad_snapshot,
        admin_token=args.admin_token or None, shards=args.shards,
        heartbeat_timeout_s=args.heartbeat_timeout,
    )
    try:
        asyncio.run(_serve_until_signal(config))
    except SnapshotError as exc:
        print(f"radix-global index: cannot start: {exc}", file=sys.stderr)
        return 2
    return 0
