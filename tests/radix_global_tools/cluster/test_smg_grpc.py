"""The harness's calls to an engine served over smg's gRPC protocol, against an in-process gRPC
server that speaks that protocol (the real smg_grpc_proto service; the engine behind it is a fake
that answers from fixed values), and the gRPC engine set's command line."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2, sglang_scheduler_pb2, sglang_scheduler_pb2_grpc

from radix_global_tools.cluster import smg_grpc
from radix_global_tools.cluster.local import EngineSet, engine_argv
from sglang_patch.ports import free_port


class FakeScheduler(sglang_scheduler_pb2_grpc.SglangSchedulerServicer):
    def __init__(self, healthy: bool = True, fail: bool = False, flushed: bool = True) -> None:
        self.healthy, self.fail, self.flushed = healthy, fail, flushed
        self.requests: list[Any] = []

    def HealthCheck(self, request: Any, context: Any) -> Any:
        return sglang_scheduler_pb2.HealthCheckResponse(healthy=self.healthy)

    def FlushCache(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
        return common_pb2.FlushCacheResponse(success=self.flushed)

    def Generate(self, request: Any, context: Any) -> Iterator[Any]:
        self.requests.append(request)
        if self.fail:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad ids")
        yield sglang_scheduler_pb2.GenerateResponse(
            chunk=sglang_scheduler_pb2.GenerateStreamChunk(token_ids=[1]))
        yield sglang_scheduler_pb2.GenerateResponse(
            complete=sglang_scheduler_pb2.GenerateComplete(cached_tokens=48))


@pytest.fixture
def serve() -> Iterator[Any]:
    servers = []

    def start(fake: FakeScheduler) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server(fake, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"grpc://127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(None)


def test_health_flush_and_generate_over_the_protocol(serve: Any) -> None:
    fake = FakeScheduler()
    url = serve(fake)
    assert smg_grpc.healthy(url) and smg_grpc.healthy(url + "/health")  # a path is ignored
    assert smg_grpc.flush(url, timeout_s=5.0)
    assert fake.requests[-1].timeout_s == 5.0  # the engine waits that long to go idle
    assert smg_grpc.generate(url, [201, 202, 203], 2) == 48
    sent = fake.requests[-1]
    assert list(sent.tokenized.input_ids) == [201, 202, 203]
    assert sent.sampling_params.max_new_tokens == 2 and sent.sampling_params.ignore_eos


def test_refusals_and_a_dead_engine_are_answers_not_exceptions(serve: Any) -> None:
    assert not smg_grpc.healthy(serve(FakeScheduler(healthy=False)))
    assert not smg_grpc.flush(serve(FakeScheduler(flushed=False)), timeout_s=1.0)  # still busy
    failing = serve(FakeScheduler(fail=True))
    assert not smg_grpc.flush(failing, timeout_s=1.0)
    assert smg_grpc.generate(failing, [201], 1) is None
    dead = f"grpc://127.0.0.1:{free_port()}"
    assert not smg_grpc.healthy(dead, timeout_s=0.5)


def test_only_grpc_urls_are_taken() -> None:
    assert smg_grpc.is_grpc("grpc://h:1") and not smg_grpc.is_grpc("http://h:1")
    with pytest.raises(ValueError, match="not a gRPC worker URL"):
        smg_grpc.healthy("http://127.0.0.1:1")


def test_grpc_engines_are_stock_engines_with_kv_events() -> None:
    spec = EngineSet("stock", "/m", grpc=True)
    argv = engine_argv(spec, 1234, 0, None, None)
    assert "--smg-grpc-mode" in argv and "--kv-events-config" in argv
    assert spec.url(1234) == "grpc://127.0.0.1:1234"
    assert EngineSet("stock", "/m").url(1234) == "http://127.0.0.1:1234"
    assert "--smg-grpc-mode" not in engine_argv(EngineSet("stock", "/m"), 1234, 0, None, None)
    for bad in ({"kind": "ours"}, {"kv_events": False}):
        with pytest.raises(ValueError, match="grpc engines"):
            EngineSet(**{"kind": "stock", "model_dir": "/m", "grpc": True, **bad})
