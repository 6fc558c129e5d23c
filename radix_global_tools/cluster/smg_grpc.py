"""The harness's side of an SGLang engine served over smg's gRPC protocol (``--smg-grpc-mode``).

Such an engine answers no HTTP: smg's servicer (``smg-grpc-servicer``) replaces SGLang's HTTP
server with the ``sglang.grpc.scheduler.SglangScheduler`` service, whose ``SubscribeKvEvents``
stream feeds smg's event-driven KV index. What the harness needs between runs, it asks over that
service: ``HealthCheck`` (is it up), ``FlushCache`` (empty the radix cache, as HTTP
``/flush_cache``) and ``Generate`` (the warm-up; it takes token ids, not text).

URLs are ``grpc://host:port``, as smg's ``--worker-urls`` takes them. Every call is bounded by a
deadline; a refused or failed call returns False or None (the caller decides whether that is
fatal).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import grpc

SCHEME = "grpc://"
# Not run at start-up: the servicer's warm-up sends synthetic token ids that the tiny test model's
# embedding does not have (IndexError in the scheduler, which then exits); the harness warms each
# engine itself with ids from the model's vocabulary (``generate``).
ENV = {"SMG_SGLANG_SERVICER_WARMUP": "off"}


def is_grpc(url: str) -> bool:
    return url.startswith(SCHEME)


@contextmanager
def _stub(url: str) -> Iterator[tuple[Any, Any, Any]]:
    """The scheduler stub and the two message modules, over a channel closed on exit.
    (``smg_grpc_proto`` is a test dependency: imported only where an engine speaks it.)"""
    from smg_grpc_proto.generated import common_pb2
    from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
    from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

    if not is_grpc(url):
        raise ValueError(f"not a gRPC worker URL: {url!r} (expected {SCHEME}host:port)")
    target = url[len(SCHEME):].split("/", 1)[0]  # host:port; a path (``/health``) means nothing
    with grpc.insecure_channel(target) as channel:
        yield pb_grpc.SglangSchedulerStub(channel), pb, common_pb2


def healthy(url: str, timeout_s: float = 3.0) -> bool:
    """True when the engine answers ``HealthCheck`` with ``healthy``."""
    with _stub(url) as (stub, pb, _):
        try:
            return bool(stub.HealthCheck(pb.HealthCheckRequest(), timeout=timeout_s).healthy)
        except grpc.RpcError:
            return False


def flush(url: str, timeout_s: float = 60.0) -> bool:
    """``FlushCache``, waiting up to ``timeout_s`` for the engine to go idle first."""
    with _stub(url) as (stub, _, common):
        try:
            resp = stub.FlushCache(common.FlushCacheRequest(timeout_s=timeout_s),
                                   timeout=timeout_s + 10.0)
        except grpc.RpcError:
            return False
        return bool(resp.success)


def generate(url: str, input_ids: Sequence[int], max_new_tokens: int,
             timeout_s: float = 600.0) -> int | None:
    """One greedy request of ``input_ids``, ``max_new_tokens`` long: the prompt tokens the engine
    found cached (its ``cached_tokens``), or None when the request failed."""
    with _stub(url) as (stub, pb, _):
        try:  # (ids out of uint32 range are protobuf's ValueError: a refused request too)
            req = pb.GenerateRequest(
                request_id=f"harness-{uuid.uuid4().hex[:12]}",
                tokenized=pb.TokenizedInput(input_ids=list(input_ids)),
                sampling_params=pb.SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens,
                                                  ignore_eos=True))
            for resp in stub.Generate(req, timeout=timeout_s):
                if resp.HasField("complete"):
                    return int(resp.complete.cached_tokens)
        except (grpc.RpcError, ValueError):
            return None
    return None
