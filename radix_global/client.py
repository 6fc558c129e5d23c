"""Clients of the index service with the query methods of ``GlobalIndex``: a router (or a
``ShardedIndex`` over remote shards) uses one where it would use the in-process index.

``IndexClient`` is blocking, ``AsyncIndexClient`` is for asyncio; both raise the same typed
errors as the in-process index (``UnknownNamespaceError``, ``PageSizeMismatchError``...), chosen
by the service's ``rg-reason`` trailer, else :class:`IndexServiceError`. ``now`` arguments are
accepted for interface compatibility and ignored: hotness decays on the service's clock, the one
clock every router replica shares.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import grpc

from radix_global.ops import HotPrefix, IndexOp, IndexRefusal, MatchResult
from radix_global.proto import index_pb2 as pb
from radix_global.proto import index_pb2_grpc as pb_grpc
from radix_global.registration import WorkerInfo, encode_worker_info
from radix_global.snapshot import SnapshotWritten
from radix_global.types import HolderId, Namespace, PageKey, WorkerId
from radix_global.wire import REASON_KEY, REFUSALS, hot_from_pb, match_from_pb, op_to_pb

T = TypeVar("T")


class IndexServiceError(Exception):
    """A call the service refused or could not answer; ``code`` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class NotAuthorizedError(IndexServiceError):
    """An admin call without the right token (UNAUTHENTICATED)."""


def _typed_error(err: grpc.RpcError, trailers: Any) -> Exception:
    code, details = err.code(), err.details() or ""
    reason = dict(trailers or ()).get(REASON_KEY)
    kind = REFUSALS.get(str(reason)) if reason else None
    if kind is not None:
        return kind(details)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return NotAuthorizedError(code, details)
    return IndexServiceError(code, details)


def _apply_reply(reply: pb.ApplyReply) -> None:
    """One op applied through ``apply``: raise its refusal like the in-process index does."""
    for reason in reply.refused:
        raise REFUSALS.get(reason, IndexRefusal)(f"the index service refused the op: {reason}")


def _snapshot_reply(r: pb.SnapshotReply) -> SnapshotWritten:
    return SnapshotWritten(r.path, r.size_bytes, r.seconds)


def _stats_reply(r: pb.StatsReply) -> dict[str, Any]:
    return dict(json.loads(r.stats_json))


def _metadata(admin_token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {admin_token}"),) if admin_token else ()


class _Requests:
    """Request builders shared by both clients (one place that knows the messages)."""

    @staticmethod
    def register(info: WorkerInfo | bytes | str) -> pb.RegisterRequest:
        raw = encode_worker_info(info) if isinstance(info, WorkerInfo) else info
        return pb.RegisterRequest(worker_info_json=raw.encode() if isinstance(raw, str) else raw)

    @staticmethod
    def match(namespace: Namespace, keys: Sequence[PageKey]) -> pb.MatchRequest:
        return pb.MatchRequest(namespace=namespace, keys=keys)

    @staticmethod
    def apply(ops: Iterable[IndexOp]) -> pb.ApplyRequest:
        return pb.ApplyRequest(ops=[op_to_pb(op) for op in ops])


class IndexClient:
    """Blocking client. ``IndexClient("127.0.0.1:50051", admin_token=...)``; close() when done."""

    def __init__(self, target: str, admin_token: str | None = None, timeout_s: float = 5.0
                 ) -> None:
        self._channel = grpc.insecure_channel(target)
        self._stub = pb_grpc.GlobalIndexServiceStub(self._channel)
        self._md = _metadata(admin_token)
        self.timeout_s = timeout_s

    def _call(self, rpc: str, request: Any, convert: Callable[[Any], T]) -> T:
        try:
            reply = getattr(self._stub, rpc)(request, timeout=self.timeout_s, metadata=self._md)
        except grpc.RpcError as err:
            raise _typed_error(err, err.trailing_metadata()) from None
        return convert(reply)

    def register(self, info: WorkerInfo | bytes | str) -> bool:
        """Register (or replace) a worker; True when the service subscribed to its KV events."""
        return self._call("Register", _Requests.register(info), lambda r: bool(r.subscribed))

    def deregister(self, worker_id: WorkerId) -> None:
        self._call("Deregister", pb.WorkerRef(worker_id=worker_id), lambda r: None)

    def heartbeat(self, worker_id: WorkerId) -> None:
        self._call("Heartbeat", pb.WorkerRef(worker_id=worker_id), lambda r: None)

    def register_namespace(self, namespace: Namespace, page_size: int) -> None:
        req = pb.NamespaceRequest(namespace=namespace, page_size=page_size)
        self._call("RegisterNamespace", req, lambda r: None)

    def apply(self, op: IndexOp) -> None:
        self._call("Apply", _Requests.apply([op]), _apply_reply)

    def apply_many(self, ops: Iterable[IndexOp]) -> tuple[int, dict[str, int]]:
        """Apply a batch; refused ops are counted, not raised: ``(applied, reason -> count)``."""
        return self._call("Apply", _Requests.apply(ops), lambda r: (r.applied, dict(r.refused)))

    def remove_holder(self, holder: HolderId) -> None:
        self._call("RemoveHolder", pb.HolderRef(holder=holder), lambda r: None)

    def match(self, namespace: Namespace, keys: Sequence[PageKey], now: float | None = None
              ) -> MatchResult:
        return self._call("Match", _Requests.match(namespace, keys), match_from_pb)

    def hot_prefixes(self, namespace: Namespace, top_k: int, now: float | None = None
                     ) -> list[HotPrefix]:
        req = pb.HotPrefixesRequest(namespace=namespace, top_k=top_k)
        return self._call("HotPrefixes", req, hot_from_pb)

    def stats(self) -> dict[str, Any]:
        return self._call("Stats", pb.StatsRequest(), _stats_reply)

    def snapshot(self) -> SnapshotWritten:
        """Ask the service to write its snapshot now."""
        return self._call("Snapshot", pb.SnapshotRequest(), _snapshot_reply)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> IndexClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncIndexClient:
    """asyncio client with the methods of :class:`IndexClient` as coroutines."""

    def __init__(self, target: str, admin_token: str | None = None, timeout_s: float = 5.0
                 ) -> None:
        self._channel = grpc.aio.insecure_channel(target)
        self._stub = pb_grpc.GlobalIndexServiceStub(self._channel)
        self._md = _metadata(admin_token)
        self.timeout_s = timeout_s

    async def _call(self, rpc: str, request: Any, convert: Callable[[Any], T]) -> T:
        try:
            reply = await getattr(self._stub, rpc)(request, timeout=self.timeout_s,
                                                   metadata=self._md)
        except grpc.aio.AioRpcError as err:
            raise _typed_error(err, err.trailing_metadata()) from None
        return convert(reply)

    async def register(self, info: WorkerInfo | bytes | str) -> bool:
        return await self._call("Register", _Requests.register(info),
                                lambda r: bool(r.subscribed))

    async def deregister(self, worker_id: WorkerId) -> None:
        await self._call("Deregister", pb.WorkerRef(worker_id=worker_id), lambda r: None)

    async def heartbeat(self, worker_id: WorkerId) -> None:
        await self._call("Heartbeat", pb.WorkerRef(worker_id=worker_id), lambda r: None)

    async def register_namespace(self, namespace: Namespace, page_size: int) -> None:
        req = pb.NamespaceRequest(namespace=namespace, page_size=page_size)
        await self._call("RegisterNamespace", req, lambda r: None)

    async def apply(self, op: IndexOp) -> None:
        await self._call("Apply", _Requests.apply([op]), _apply_reply)

    async def apply_many(self, ops: Iterable[IndexOp]) -> tuple[int, dict[str, int]]:
        return await self._call("Apply", _Requests.apply(ops),
                                lambda r: (r.applied, dict(r.refused)))

    async def remove_holder(self, holder: HolderId) -> None:
        await self._call("RemoveHolder", pb.HolderRef(holder=holder), lambda r: None)

    async def match(self, namespace: Namespace, keys: Sequence[PageKey],
                    now: float | None = None) -> MatchResult:
        return await self._call("Match", _Requests.match(namespace, keys), match_from_pb)

    async def hot_prefixes(self, namespace: Namespace, top_k: int, now: float | None = None
                           ) -> list[HotPrefix]:
        req = pb.HotPrefixesRequest(namespace=namespace, top_k=top_k)
        return await self._call("HotPrefixes", req, hot_from_pb)

    async def stats(self) -> dict[str, Any]:
        return await self._call("Stats", pb.StatsRequest(), _stats_reply)

    async def snapshot(self) -> SnapshotWritten:
        return await self._call("Snapshot", pb.SnapshotRequest(), _snapshot_reply)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncIndexClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
