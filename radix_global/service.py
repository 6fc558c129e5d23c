"""The standalone index service: ``radix-global index serve`` (gRPC,
``radix_global/proto/index.proto``).

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
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from radix_global.ops import (
    IndexRefusal,
    PageSizeMismatchError,
    UnknownNamespaceError,
)
from radix_global.options import OptionError
from radix_global.proto import index_pb2 as pb
from radix_global.proto import index_pb2_grpc as pb_grpc
from radix_global.registration import (
    RegistrationError,
    decode_worker_info,
    refuse_host_local,
)
from radix_global.service_config import (
    PROG,
    ServiceConfig,
    add_serve_arguments,
    config_from,
    example_config,
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
SERVICE_NAME = "radix_global.index.v1.GlobalIndexService"  # the health service's name for it
_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (UnknownWorkerError, grpc.StatusCode.NOT_FOUND),
    (UnknownNamespaceError, grpc.StatusCode.NOT_FOUND),
    (PageSizeMismatchError, grpc.StatusCode.ALREADY_EXISTS),
    (IdConflictError, grpc.StatusCode.ALREADY_EXISTS),
    (RegistrationError, grpc.StatusCode.INVALID_ARGUMENT),
    (IndexRefusal, grpc.StatusCode.INVALID_ARGUMENT),
    (SnapshotError, grpc.StatusCode.FAILED_PRECONDITION),
]


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
        self.health: health.aio.HealthServicer | None = None
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
        # the standard health service: what load balancers and grpc-health-probe ask
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.port = self._server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        await self._server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
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
        if self.health is not None:
            await self.health.enter_graceful_shutdown()  # NOT_SERVING while it drains
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
    conductor = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    metrics = None
    try:
        if config.metrics_port is not None:
            from radix_global.index_http import serve_metrics

            # the state is read at each scrape: a restored snapshot replaces it
            metrics = await serve_metrics(config.host, config.metrics_port,
                                          lambda: server.state.index.stats(),
                                          lambda: server.state.subscriber.stats())
            print(f"radix-global index: metrics on {config.host}:{metrics.port}", flush=True)
        if config.conductor_port is not None:
            from radix_global.conductor_api import serve_conductor_api

            conductor = await serve_conductor_api(server.state, config.host,
                                                  config.conductor_port, config.admin_token)
            print(f"radix-global index: conductor API on {config.host}:{conductor.port}",
                  flush=True)
        await stop.wait()
    finally:
        if conductor is not None:
            await conductor.stop()
        if metrics is not None:
            await metrics.stop()
        await server.stop()


def parser() -> argparse.ArgumentParser:
    """``radix-global index``: one subparser per command (``serve``; another joins beside it)."""
    top = argparse.ArgumentParser(prog=PROG)
    sub = top.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the standalone global index (gRPC)")
    add_serve_arguments(serve)
    return top


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``radix-global index serve``; a bad option is one line and exit 2."""
    args = vars(parser().parse_args(argv))
    if args.get("print_example_config"):
        print(example_config(), end="")
        return 0
    try:
        config = config_from(args, os.environ if environ is None else environ)
    except OptionError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve_until_signal(config))
    except (SnapshotError, OSError) as exc:  # OSError: a port that cannot be bound
        print(f"{PROG}: cannot start: {exc}", file=sys.stderr)
        return 2
    return 0
