"""The index service over real gRPC on 127.0.0.1: registration, queries, snapshots, errors, auth."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import msgspec
import pytest
import zmq
from service_harness import ServerThread

from radix_global.client import AsyncIndexClient, IndexClient, NotAuthorizedError
from radix_global.index import GlobalIndex
from radix_global.keys import page_keys
from radix_global.ops import (
    IndexOp,
    PageSizeMismatchError,
    RemovePages,
    StorePages,
    UnknownNamespaceError,
    UnknownParentError,
)
from radix_global.proto import index_pb2 as pb
from radix_global.proto import index_pb2_grpc as pb_grpc
from radix_global.registration import RegistrationError, WorkerInfo, encode_worker_info
from radix_global.service import ServiceConfig
from radix_global.service_guard import is_loopback_peer
from radix_global.shards import ShardedIndex
from radix_global.snapshot import IndexSnapshot, SnapshotError, encode_snapshot, write_snapshot
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId
from radix_global.wire import IdConflictError, UnknownWorkerError

NS = Namespace("tiny@1")
PAGE = 4
TOKEN = "s3cret"


def _worker(i: int, **kw: object) -> WorkerInfo:
    fields: dict = dict(worker_id=f"sgl-{i}", url=f"http://127.0.0.1:{30000 + i}", model="tiny",
                        namespace=NS, page_size=PAGE)
    fields.update(kw)
    return WorkerInfo(**fields)


def _prompt(seed: int, pages: int, shared: int = 0) -> list[PageKey]:
    system = list(range(1000, 1000 + PAGE * shared))
    body = [(seed * 7919 + t) % 5000 for t in range(PAGE * (pages - shared))]
    return page_keys(system + body, PAGE)


PROMPTS = [_prompt(i, 3 + i % 5, shared=2 if i % 2 else 0) for i in range(12)]


def _ops() -> list[IndexOp]:
    ops: list[IndexOp] = []
    for i, keys in enumerate(PROMPTS):
        loc = Location(WorkerId(f"sgl-{i % 2}"), 0, Tier.GPU if i % 3 else Tier.HOST)
        ops.append(StorePages(NS, loc, None, keys[:2]))
        ops.append(StorePages(NS, loc, keys[1], keys[2:]))
    ops.append(StorePages(NS, Location(PoolId("pool-a"), 0, Tier.POOL), None, PROMPTS[0]))
    ops.append(RemovePages(NS, Location(WorkerId("sgl-1"), 0, Tier.GPU), PROMPTS[1][-1:]))
    return ops


def _reference() -> GlobalIndex:
    index = GlobalIndex()
    index.register_namespace(NS, PAGE)
    for op in _ops():
        index.apply(op)
    return index


def _fill(client: IndexClient) -> None:
    for i in range(2):
        assert client.register(_worker(i)) is False  # no events endpoint: nothing to follow
    assert client.apply_many(_ops()) == (len(_ops()), {})


@pytest.fixture
def served(tmp_path: Path):
    config = ServiceConfig(snapshot_path=str(tmp_path / "index.snap"), admin_token=TOKEN)
    with ServerThread(config) as st, IndexClient(st.target, admin_token=TOKEN) as client:
        yield st, client


def test_register_match_stats_and_hot_prefixes(served) -> None:
    _, client = served
    _fill(client)
    ref = _reference()
    for keys in PROMPTS:
        got, want = client.match(NS, keys), ref.match(NS, keys, now=time.time())
        assert got == want
    assert client.match(NS, PROMPTS[0]).matched[(PoolId("pool-a"), 0)].pool == len(PROMPTS[0])
    assert client.match(NS, PROMPTS[2]).best_pages == len(PROMPTS[2]) > 0
    stats = client.stats()
    assert stats["pages"] == ref.stats().pages > 0
    assert stats["service"]["workers"] == 2
    hot = client.hot_prefixes(NS, 3)
    assert 0 < len(hot) <= 3 and all(p.hit_rate > 0 for p in hot)
    assert hot == sorted(hot, key=lambda p: -p.hit_rate)


def test_deregister_drops_the_workers_entries_but_not_the_pools(served) -> None:
    _, client = served
    _fill(client)
    client.deregister(WorkerId("sgl-0"))
    result = client.match(NS, PROMPTS[0])
    assert set(result.matched) == {(PoolId("pool-a"), 0)}
    assert client.stats()["service"]["workers"] == 1
    with pytest.raises(UnknownWorkerError):
        client.deregister(WorkerId("sgl-0"))


def _code(call, request, metadata=(("authorization", f"Bearer {TOKEN}"),)):
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=5, metadata=metadata)
    return info.value.code(), info.value.details()


def test_bad_input_gets_proper_status_codes(served) -> None:
    st, client = served
    _fill(client)
    stub = pb_grpc.GlobalIndexServiceStub(grpc.insecure_channel(st.target))
    code, details = _code(stub.Register, pb.RegisterRequest(worker_info_json=b"{nope"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "malformed JSON" in details
    bad_url = b'{"worker_id":"w","url":"ftp://x","model":"m","namespace":"m@1","page_size":4}'
    code, details = _code(stub.Register, pb.RegisterRequest(worker_info_json=bad_url))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "url" in details
    other_size = encode_worker_info(_worker(5, page_size=PAGE * 2))
    code, details = _code(stub.Register, pb.RegisterRequest(worker_info_json=other_size))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "page size" in details
    code, _ = _code(stub.Deregister, pb.WorkerRef(worker_id="nobody"))
    assert code == grpc.StatusCode.NOT_FOUND
    code, details = _code(stub.Heartbeat, pb.WorkerRef(worker_id="nobody"))
    assert code == grpc.StatusCode.NOT_FOUND and "register again" in details
    code, _ = _code(stub.Match, pb.MatchRequest(namespace="other@1", keys=[1]))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = _code(stub.HotPrefixes, pb.HotPrefixesRequest(namespace=NS, top_k=0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    empty_op = stub.Apply(pb.ApplyRequest(ops=[pb.IndexOp()]), timeout=5,
                          metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert dict(empty_op.refused) == {"malformed": 1}  # an op is an event: counted, dropped
    # The typed client raises what the in-process index raises.
    with pytest.raises(UnknownNamespaceError):
        client.match(Namespace("other@1"), [PageKey(1)])
    with pytest.raises(PageSizeMismatchError):
        client.register(_worker(5, page_size=8))
    with pytest.raises(IdConflictError):
        client.register(_worker(6, pool_id="sgl-0"))  # a pool id equal to a worker id
    with pytest.raises(RegistrationError):
        client.register(b"[]")
    # Refused ops are counted per reason, the rest applied.
    orphan = StorePages(NS, Location(WorkerId("sgl-0"), 0, Tier.GPU), PageKey(99), [PageKey(1)])
    assert client.apply_many([orphan, *_ops()[:1]]) == (1, {"unknown_parent": 1})
    assert client.stats()["service"]["workers"] == 2, "refusals must not change the registry"


def test_admin_calls_need_the_token(served) -> None:
    st, _ = served
    for token in (None, "wrong"):
        with IndexClient(st.target, admin_token=token) as anon:
            with pytest.raises(NotAuthorizedError):
                anon.register(_worker(0))
            with pytest.raises(NotAuthorizedError):
                anon.heartbeat(WorkerId("sgl-0"))
            with pytest.raises(NotAuthorizedError):
                anon.snapshot()
            with pytest.raises(NotAuthorizedError):
                anon.match(NS, PROMPTS[0])  # key queries too (issue 35)
            assert anon.stats()["service"]["workers"] == 0  # Stats is open: counts, no keys
    stub = pb_grpc.GlobalIndexServiceStub(grpc.insecure_channel(st.target))
    code, _ = _code(stub.Deregister, pb.WorkerRef(worker_id="x"), metadata=())
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_without_a_token_admin_calls_only_from_loopback() -> None:
    assert is_loopback_peer("ipv4:127.0.0.1:50000") and is_loopback_peer("ipv6:[::1]:50000")
    assert is_loopback_peer("unix:/tmp/sock") and is_loopback_peer("ipv6:[::ffff:127.0.0.1]:1")
    assert not is_loopback_peer("ipv4:10.0.0.5:50000")
    assert not is_loopback_peer("ipv6:[2001:db8::1]:50000")
    assert not is_loopback_peer("ipv4:1.127.0.0:5")


def test_sharded_index_over_two_remote_services() -> None:
    """ShardedIndex over two IndexClients (each a real service): one prompt per service, the
    same answers as one in-process index."""
    ref = _reference()
    with ServerThread(ServiceConfig()) as a, ServerThread(ServiceConfig()) as b:
        clients = [IndexClient(a.target), IndexClient(b.target)]
        try:
            sharded = ShardedIndex(clients)
            sharded.register_namespace(NS, PAGE)
            for op in _ops():
                sharded.apply(op)
            for keys in PROMPTS:
                assert sharded.match(NS, keys, 0.0) == ref.match(NS, keys, 0.0)
            pages = [c.stats()["pages"] for c in clients]
            assert sum(pages) == ref.stats().pages and min(pages) > 0
            assert sharded.stats()["pages"] == ref.stats().pages
        finally:
            for c in clients:
                c.close()


def test_snapshot_and_restore_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "index.snap"
    config = ServiceConfig(snapshot_path=str(path), admin_token=TOKEN)
    with ServerThread(config) as st, IndexClient(st.target, admin_token=TOKEN) as client:
        _fill(client)
        for keys in PROMPTS[:4]:
            client.match(NS, keys)  # hits, so that hot prefixes survive too
        before = [client.match(NS, keys) for keys in PROMPTS]
        written = client.snapshot()
        assert written.path == str(path) and written.size_bytes == path.stat().st_size > 0
        hot_before = {p.keys for p in client.hot_prefixes(NS, 3)}
        assert hot_before and all(b.best_pages > 0 for b in before)
    with ServerThread(config) as st, IndexClient(st.target, admin_token=TOKEN) as client:
        assert [client.match(NS, keys) for keys in PROMPTS] == before
        assert client.stats()["service"]["workers"] == 2
        client.heartbeat(WorkerId("sgl-1"))  # the registry came back too
        assert {p.keys for p in client.hot_prefixes(NS, 3)} == hot_before
    # A service started with another shard count refuses the snapshot rather than mis-route.
    with pytest.raises(SnapshotError, match="1 shard"):
        ServerThread(ServiceConfig(snapshot_path=str(path), shards=2)).start()


def test_periodic_snapshot_and_bad_snapshot_on_start(tmp_path: Path) -> None:
    path = tmp_path / "index.snap"
    config = ServiceConfig(snapshot_path=str(path), snapshot_interval_s=0.1)
    with ServerThread(config) as st, IndexClient(st.target) as client:
        _fill(client)
        deadline = time.monotonic() + 5
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.exists(), "no periodic snapshot within 5 s"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SnapshotError, match="truncated"):
        ServerThread(ServiceConfig(snapshot_path=str(path))).start()
    lenient = ServiceConfig(snapshot_path=str(path), start_empty_on_bad_snapshot=True)
    with ServerThread(lenient) as st, IndexClient(st.target) as client:
        assert client.stats()["pages"] == 0
    # A well-formed file whose index state is not an index: refused too, or skipped if asked.
    write_snapshot(path, encode_snapshot(IndexSnapshot(0.0, {"version": 1}, [])))
    with pytest.raises(SnapshotError, match="cannot be restored"):
        ServerThread(ServiceConfig(snapshot_path=str(path))).start()
    with ServerThread(lenient) as st, IndexClient(st.target) as client:
        assert client.stats()["pages"] == 0


def test_two_shard_service_answers_like_one_index(tmp_path: Path) -> None:
    config = ServiceConfig(shards=2, snapshot_path=str(tmp_path / "s.snap"))
    ref = _reference()
    with ServerThread(config) as st, IndexClient(st.target) as client:
        _fill(client)
        assert [client.match(NS, k) for k in PROMPTS] == [ref.match(NS, k, 1.0) for k in PROMPTS]
        per_shard = client.stats()["per_shard"]
        assert len(per_shard) == 2 and all(s["pages"] > 0 for s in per_shard)
    with ServerThread(config) as st, IndexClient(st.target) as client:  # restart, 2 shards
        assert [client.match(NS, k) for k in PROMPTS] == [ref.match(NS, k, 1.0) for k in PROMPTS]


def test_register_follows_the_workers_kv_events() -> None:
    """Register with an events endpoint: the service subscribes (ZMQ) and indexes what the worker
    publishes (SGLang's array-form KVEventBatch); deregistering drops it again."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        keys = PROMPTS[3]
        tokens = list(range(PAGE * len(keys)))
        event = ["BlockStored", keys, None, tokens, PAGE, None, "GPU"]
        with ServerThread(ServiceConfig()) as st, IndexClient(st.target) as client:
            assert client.register(_worker(0, kv_events_endpoint=endpoint)) is True
            deadline, seq = time.monotonic() + 10, 0
            while time.monotonic() < deadline and client.match(NS, keys).best_pages == 0:
                payload = msgspec.msgpack.encode([time.time(), [event], 0])
                pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])
                seq += 1
                time.sleep(0.05)  # the SUB joins asynchronously: publish until it hears
            result = client.match(NS, keys)
            assert result.matched == {(WorkerId("sgl-0"), 0): (len(keys), len(keys), len(keys))}
            assert client.stats()["service"]["events"]["ops_applied"] >= 1
            client.deregister(WorkerId("sgl-0"))
            assert client.match(NS, keys).best_pages == 0
    finally:
        pub.close(linger=0)
        ctx.term()


def test_heartbeats_time_out() -> None:
    config = ServiceConfig(heartbeat_timeout_s=1.5)  # margin for a loaded 2-core machine
    with ServerThread(config) as st, IndexClient(st.target) as client:
        client.register(_worker(0))
        client.register(_worker(1))
        client.apply_many(_ops())
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and client.stats()["service"]["workers"] > 1:
            client.heartbeat(WorkerId("sgl-1"))  # only sgl-1 keeps beating
            time.sleep(0.1)
        assert client.stats()["service"]["workers"] == 1
        holders = {h for h, _ in client.match(NS, PROMPTS[0]).matched}
        assert holders == {PoolId("pool-a")}, "a timed-out worker's pages must be gone"
        assert client.match(NS, PROMPTS[1]).best_pages > 0  # sgl-1's pages stay
        with pytest.raises(UnknownWorkerError):
            client.heartbeat(WorkerId("sgl-0"))


@pytest.mark.asyncio
async def test_async_client(tmp_path: Path) -> None:
    from radix_global.service import IndexServer

    server = await IndexServer(ServiceConfig(admin_token=TOKEN)).start()
    try:
        async with AsyncIndexClient(f"127.0.0.1:{server.port}", admin_token=TOKEN) as client:
            assert await client.register(_worker(0)) is False
            await client.register_namespace(Namespace("other@2"), 8)
            for op in _ops()[:4]:
                await client.apply(op)
            assert await client.apply_many(_ops()[4:8]) == (4, {})
            result = await client.match(NS, PROMPTS[0])
            assert result.best_pages == len(PROMPTS[0])
            await client.remove_holder(WorkerId("sgl-0"))
            assert (await client.match(NS, PROMPTS[0])).best_pages == 0
            with pytest.raises(UnknownParentError):
                await client.apply(StorePages(NS, Location(WorkerId("sgl-0"), 0, Tier.GPU),
                                              PageKey(5), [PageKey(6)]))
            assert (await client.stats())["service"]["workers"] == 1
            with pytest.raises(UnknownNamespaceError):
                await client.hot_prefixes(Namespace("x@1"), 1)
    finally:
        await server.stop(0.1)


def test_a_segment_of_a_shared_store_leaves_with_its_worker(served) -> None:
    """A Mooncake segment dies with its client (radix_global/pool_ids.py): deregistering the
    worker drops it and its disk tier; a pool of its own (pool-a above) stays."""
    _, client = served
    _fill(client)
    segment = PoolId("mooncake-m-1@10.0.0.2:30000")
    disk = PoolId(f"{segment}+disk")
    seg_worker = _worker(2, pool_id=segment, pool_disk_id=disk)
    client.register(seg_worker)
    client.apply_many([StorePages(NS, Location(holder, 0, Tier.POOL), None, PROMPTS[0])
                       for holder in (segment, disk)])
    assert (segment, 0) in client.match(NS, PROMPTS[0]).matched
    # A second worker naming the same segment is refused (issue 35, item 10): leaving, it took
    # the first one's entries with it. The first one registering again is no conflict.
    with pytest.raises(IdConflictError, match="segment"):
        client.register(_worker(3, pool_id=segment))
    client.register(seg_worker)
    assert (segment, 0) in client.match(NS, PROMPTS[0]).matched
    client.deregister(WorkerId(seg_worker.worker_id))
    held = client.match(NS, PROMPTS[0]).matched
    assert (segment, 0) not in held and (disk, 0) not in held and (PoolId("pool-a"), 0) in held
