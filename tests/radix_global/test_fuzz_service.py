"""Fuzz: gRPC requests to an in-process index service (issue 12).

One service for the module (real gRPC on 127.0.0.1, an admin token, a snapshot path). Requests
with arbitrary fields and sizes go to every RPC, raw bytes to some; and raw bytes (random, or a
valid message cut or with bytes flipped) to every method by its path (issue 35: a malformed
message was UNKNOWN with a logged traceback). Oracle, per request: an OK answer or a clear status
(INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, UNAUTHENTICATED), never
INTERNAL/UNKNOWN or a hang; afterwards the service still answers a valid request correctly (a
canary chain stays matched) and, at the end, still writes a snapshot that restores. Counts go to
``RADIX_FUZZ_REPORT`` (see ``fuzz_tally.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest
from fuzz_tally import Tally, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_harness import ServerThread

from radix_global.endpoints import endpoint_problem
from radix_global.index import GlobalIndex
from radix_global.keys import page_keys
from radix_global.proto import index_pb2 as pb
from radix_global.proto import index_pb2_grpc as pb_grpc
from radix_global.service import ServiceConfig
from radix_global.snapshot import read_snapshot

pytestmark = pytest.mark.timeout(300)
TOKEN = "fuzz-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
NS = "tiny@1"
PAGE = 4
CANARY = page_keys(list(range(64)), PAGE)  # 16 pages held by "canary"
CLEAR = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
         grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
         grpc.StatusCode.UNAUTHENTICATED}
TALLY = Tally("grpc_requests")
RAW_TALLY = Tally("grpc_raw_bytes")
METHODS = ("Register", "Deregister", "Heartbeat", "Match", "Stats", "HotPrefixes", "Snapshot",
           "Apply", "RemoveHolder", "RegisterNamespace")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, Any]]:
    path = tmp_path_factory.mktemp("fuzz") / "index.snap"
    config = ServiceConfig(admin_token=TOKEN, snapshot_path=str(path), heartbeat_timeout_s=3600)
    with ServerThread(config) as st_:
        channel = grpc.insecure_channel(st_.target)
        stub = pb_grpc.GlobalIndexServiceStub(channel)
        stub.RegisterNamespace(pb.NamespaceRequest(namespace=NS, page_size=PAGE), metadata=AUTH)
        loc = pb.Location(holder="canary", dp_rank=0, tier=1)
        stub.Apply(pb.ApplyRequest(ops=[pb.IndexOp(store=pb.StorePages(
            namespace=NS, location=loc, keys=CANARY))]), metadata=AUTH)
        yield stub, path, channel
        channel.close()
    TALLY.write()
    RAW_TALLY.write()
    # The final snapshot (written by stop) is a good file: nothing the fuzz sent poisoned it.
    GlobalIndex.restore(read_snapshot(path).index)


text = st.one_of(st.text(max_size=40), st.sampled_from(["", NS, "canary", "w-1", "x@1", "a/b"]),
                 st.text(max_size=3000))
i64 = st.integers(-(2**63), 2**63 - 1)
u32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 10_000, 10_001, 2**32 - 1]))
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), text),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12)
ENDPOINTS = ["tcp://*:5557", "garbage", "tcp://127.0.0.1:1", "ipc:///tmp/rg-fuzz-none",
             "tcp://127.0.0.1:65535", "inproc://x", "", "tcp://127.0.0.1:notaport"]
FIELD_VALUES = {
    "worker_id": st.one_of(st.sampled_from(["w-1", "w-2", "canary", "", "a/b"]), text),
    "url": st.sampled_from(["http://127.0.0.1:1", "ftp://x", ""]),
    "namespace": st.sampled_from([NS, "x@1", "nons"]),
    "page_size": st.one_of(st.sampled_from([PAGE, 8, 0, -1]), st.integers(-(2**70), 2**70)),
    "dp_size": st.one_of(st.integers(0, 4), st.sampled_from([1024, 1025]),
                         st.integers(-(2**70), 2**70)),
    "kv_events_endpoint": st.sampled_from(ENDPOINTS),
    "kv_events_replay_endpoint": st.sampled_from(ENDPOINTS),
    "pool_id": st.one_of(st.sampled_from(["pool-a", "canary", "w-1"]), text),
    "pool_events_endpoint": st.sampled_from(ENDPOINTS),
    "role": st.sampled_from(["mixed", "decode", "boss"]),
    "engine": st.sampled_from(["sglang", "vllm", "other", "x"]),
    "bootstrap_port": st.integers(-5, 70_000),
    "bogus": json_value,
}
BASE = {"worker_id": "w-1", "url": "http://127.0.0.1:1", "model": "tiny", "namespace": NS,
        "page_size": PAGE, "kv_events_endpoint": "tcp://127.0.0.1:1"}
# A valid record with a few fields replaced (or added), so most fields' checks are reached.
record = st.lists(st.sampled_from(sorted(FIELD_VALUES)), min_size=1, max_size=3).flatmap(
    lambda names: st.fixed_dictionaries({n: FIELD_VALUES[n] for n in names})).map(
    lambda change: {**BASE, **change})
register_json = st.one_of(record.map(msgspec.json.encode), record.map(msgspec.json.encode),
                          json_value.map(msgspec.json.encode),
                          st.binary(max_size=200), st.integers(1, 5000).map(
                              lambda d: b"[" * d + b"]" * d))
location = st.builds(pb.Location, holder=text, dp_rank=u32, tier=st.integers(0, 5))
op = st.one_of(
    st.builds(lambda ns, loc, parent, keys: pb.IndexOp(store=pb.StorePages(
        namespace=ns, location=loc, keys=keys, **({} if parent is None else {"parent": parent}))),
        text, location, st.one_of(st.none(), i64, st.sampled_from(CANARY)),
        st.lists(st.one_of(i64, st.sampled_from(CANARY)), max_size=40)),
    st.builds(lambda ns, loc, keys: pb.IndexOp(remove=pb.RemovePages(
        namespace=ns, location=loc, keys=keys)), text, location, st.lists(i64, max_size=40)),
    st.builds(lambda h, t, r: pb.IndexOp(clear=pb.ClearHolder(
        holder=h, tier=t, **({} if r is None else {"dp_rank": r}))),
        st.sampled_from(["w-1", "", "pool-a"]), st.integers(0, 5), st.one_of(st.none(), u32)),
    st.just(pb.IndexOp()),
)
meta = st.sampled_from([AUTH, AUTH, AUTH, (), (("authorization", "Bearer wrong"),)])
register = st.tuples(st.just("Register"), register_json.map(
    lambda b: pb.RegisterRequest(worker_info_json=b)), meta)
requests = st.one_of(
    register, register, register,
    st.tuples(st.just("Deregister"), text.map(lambda w: pb.WorkerRef(worker_id=w)), meta),
    st.tuples(st.just("Heartbeat"), text.map(lambda w: pb.WorkerRef(worker_id=w)), meta),
    st.tuples(st.just("Match"), st.builds(pb.MatchRequest, namespace=text, keys=st.lists(
        i64, max_size=3000)), meta),
    st.tuples(st.just("HotPrefixes"), st.builds(pb.HotPrefixesRequest, namespace=text,
                                                top_k=u32), meta),
    st.tuples(st.just("Apply"), st.lists(op, max_size=6).map(lambda o: pb.ApplyRequest(ops=o)),
              meta),
    st.tuples(st.just("RemoveHolder"), st.sampled_from(["w-1", "w-2", "", "pool-a"]).map(
        lambda h: pb.HolderRef(holder=h)), meta),
    st.tuples(st.just("RegisterNamespace"), st.builds(pb.NamespaceRequest, namespace=text,
                                                      page_size=u32), meta),
    st.tuples(st.just("Stats"), st.just(pb.StatsRequest()), meta),
    st.tuples(st.just("Snapshot"), st.just(pb.SnapshotRequest()), meta),
)


def _canary_ok(stub: Any) -> bool:
    reply = stub.Match(pb.MatchRequest(namespace=NS, keys=CANARY), timeout=10,
                       metadata=AUTH)  # key queries need the token (issue 35)
    return any(m.holder == "canary" and m.gpu == len(CANARY) for m in reply.matched)


@settings(max_examples=examples(150), suppress_health_check=list(HealthCheck))
@given(request=requests)
def test_fuzz_grpc_requests(service: Any, request: tuple[str, Any, Any]) -> None:
    stub, _, _ = service
    name, message, metadata = request
    if name not in ("Match", "HotPrefixes") and "canary" in str(message):
        return  # an authorised caller may legitimately drop (or replace) the canary itself
    with TALLY.timed():
        try:
            reply = getattr(stub, name)(message, timeout=10, metadata=metadata)
            outcome = "ok"
            if name == "Register" and reply.subscribed:
                sent = msgspec.json.decode(message.worker_info_json)
                if endpoint_problem(sent["kv_events_endpoint"], sent.get("dp_size", 1)):
                    TALLY.add("loss")
                    raise AssertionError(f"subscribed: true for {sent['kv_events_endpoint']!r}")
        except grpc.RpcError as err:
            if err.code() not in CLEAR:
                TALLY.add("crash")
                raise AssertionError(f"{name}: {err.code()} {err.details()}") from None
            outcome = "refused"
        if not _canary_ok(stub):
            TALLY.add("loss")
            raise AssertionError(f"{name} request lost the canary's entries")
        TALLY.add(outcome)


def _damaged(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data[: max(0, len(data) - cut)])
    for at, value in flips:
        if out:
            out[at % len(out)] = value
    return bytes(out)


VALID = [pb.MatchRequest(namespace=NS, keys=[1, -2, 3]).SerializeToString(),
         pb.ApplyRequest(ops=[pb.IndexOp(store=pb.StorePages(
             namespace=NS, location=pb.Location(holder="w-9", dp_rank=0, tier=1),
             keys=[5, 6]))]).SerializeToString(),
         pb.RegisterRequest(worker_info_json=msgspec.json.encode(BASE)).SerializeToString(),
         pb.HotPrefixesRequest(namespace=NS, top_k=4).SerializeToString()]
raw_bytes = st.one_of(
    st.binary(max_size=300),
    st.builds(_damaged, st.sampled_from(VALID), st.integers(0, 8),
              st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4)))


@settings(max_examples=examples(150), suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(METHODS), data=raw_bytes, metadata=meta)
def test_fuzz_raw_bytes_on_every_method(service: Any, method: str, data: bytes,
                                        metadata: Any) -> None:
    stub, _, channel = service
    if b"canary" in data:
        return  # as above: a message naming the canary may drop it
    call = channel.unary_unary(f"/radix_global.index.v1.GlobalIndexService/{method}")
    with RAW_TALLY.timed():
        try:
            call(data, timeout=10, metadata=metadata)
            outcome = "ok"  # protobuf is lenient: many byte strings are valid messages
        except grpc.RpcError as err:
            if err.code() not in CLEAR:
                RAW_TALLY.add("crash")
                raise AssertionError(f"{method} {data!r}: {err.code()} {err.details()}"
                                     ) from None
            outcome = "refused"
        if not _canary_ok(stub):
            RAW_TALLY.add("loss")
            raise AssertionError(f"{method} {data!r} lost the canary's entries")
        RAW_TALLY.add(outcome)
