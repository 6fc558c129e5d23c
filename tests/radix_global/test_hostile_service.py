"""The index service must survive a bad worker record and a bad snapshot (issue 12, items 9, 11).

Registration refuses an endpoint no SUB can connect to (INVALID_ARGUMENT, not ``subscribed:
true``); a worker that got in anyway (restored from an older build) fails alone: the other
workers still time out, its Deregister is OK, stopping writes the final snapshot. A snapshot with a
valid checksum but bad values (``dp=inf``, deep nesting, out-of-range keys, wrong types) is a
typed error, honoured by ``start_empty_on_bad_snapshot``, and never poisons a later snapshot.

Issue 35: a query that answers about page keys (Match, HotPrefixes) is authorized like a write
(item 3); bytes that are no request message get INVALID_ARGUMENT from every method (item 11); a
snapshot clock that is not a finite, non-negative number is a SnapshotError (item 9).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest
import xxhash
from service_harness import ServerThread

from radix_global.client import IndexClient, NotAuthorizedError
from radix_global.endpoints import endpoint_problem
from radix_global.index import GlobalIndex
from radix_global.ops import MalformedEventError, StorePages
from radix_global.proto import index_pb2 as pb
from radix_global.proto import index_pb2_grpc as pb_grpc
from radix_global.registration import RegistrationError, WorkerInfo
from radix_global.service import IndexServer, ServiceConfig, _Servicer
from radix_global.shards import ShardedIndex
from radix_global.snapshot import (
    IndexSnapshot,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    read_snapshot,
)
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId

pytestmark = pytest.mark.timeout(60)
NS = Namespace("tiny@1")
PAGE = 4
KEYS = [PageKey(k) for k in (11, 12, 13)]
TOKEN = "t0ken"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def _worker(wid: str, **kw: Any) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, url="http://127.0.0.1:1", model="tiny", namespace=NS,
                      page_size=PAGE, **kw)


def _unsafe(info: WorkerInfo, **fields: Any) -> WorkerInfo:
    """A record registration refuses, as an older build may have written it to a snapshot."""
    bad = msgspec.structs.replace(info)
    for name, value in fields.items():
        msgspec.structs.force_setattr(bad, name, value)
    return bad


# ---- registration ---------------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["tcp://*:5557", "garbage", "tcp://127.0.0.1:notaport",
                                      "tcp://127.0.0.1:70000", "udp://127.0.0.1:5", "ipc://",
                                      "ipc:///" + "x" * 200, "tcp://127.0.0.1:65535#2"])
def test_unsubscribable_endpoint_is_refused_at_registration(endpoint: str) -> None:
    endpoint, _, ranks = endpoint.partition("#")
    fields = {"kv_events_endpoint": endpoint, "dp_size": int(ranks or 1)}
    with pytest.raises(RegistrationError, match="kv_events_endpoint"):
        _worker("w", **fields)
    assert endpoint_problem(endpoint, int(ranks or 1)) is not None
    record = msgspec.json.encode({**msgspec.structs.asdict(_worker("w")), **fields})
    with ServerThread(ServiceConfig()) as st:
        stub = pb_grpc.GlobalIndexServiceStub(grpc.insecure_channel(st.target))
        with pytest.raises(grpc.RpcError) as err:
            stub.Register(pb.RegisterRequest(worker_info_json=record), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "kv_events_endpoint" in (err.value.details() or "")


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:5557", "tcp://[::1]:5557",
                                      "tcp://worker-3.example:5557", "ipc:///tmp/rg/kv0",
                                      "inproc://kv"])
def test_connectable_endpoints_are_accepted(endpoint: str) -> None:
    assert _worker("w", kv_events_endpoint=endpoint, dp_size=2).kv_events_endpoint == endpoint


# ---- who may ask about page keys (issue 35, item 3) ---------------------------------------
def test_key_queries_need_the_token_stats_stays_open() -> None:
    with ServerThread(ServiceConfig(admin_token=TOKEN)) as st:
        with IndexClient(st.target, admin_token=TOKEN) as admin:
            admin.register(_worker("sgl-0"))
            admin.apply(StorePages(NS, Location(WorkerId("sgl-0"), 0, Tier.GPU), None, KEYS))
            assert admin.match(NS, KEYS).best_pages == 3
            assert [p.keys for p in admin.hot_prefixes(NS, 1)] == [tuple(KEYS)]
        for token in (None, "wrong"):
            with IndexClient(st.target, admin_token=token) as anon:
                with pytest.raises(NotAuthorizedError):
                    anon.match(NS, KEYS)  # would confirm a guess at a tenant's prompt
                with pytest.raises(NotAuthorizedError):
                    anon.hot_prefixes(NS, 1)
                assert anon.stats()["pages"] == 3  # aggregate counts, no keys: open


class _Aborted(Exception):
    pass


class _PeerContext:
    """A servicer context of a call from ``peer`` without metadata; abort raises, as grpc's."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()
                    ) -> None:
        raise _Aborted(code)


@pytest.mark.parametrize("peer", ["ipv4:10.0.0.5:5000", "ipv6:[2001:db8::1]:5000"])
def test_without_a_token_key_queries_only_from_loopback(peer: str) -> None:
    servicer = _Servicer(IndexServer(ServiceConfig()))  # no token configured
    servicer._state.index.register_namespace(NS, PAGE)
    match, hot = pb.MatchRequest(namespace=NS, keys=KEYS), pb.HotPrefixesRequest(namespace=NS,
                                                                                 top_k=1)
    for call, request in ((servicer.Match, match), (servicer.HotPrefixes, hot)):
        with pytest.raises(_Aborted) as err:
            asyncio.run(call(request, _PeerContext(peer)))
        assert err.value.args[0] == grpc.StatusCode.UNAUTHENTICATED
        asyncio.run(call(request, _PeerContext("ipv4:127.0.0.1:5000")))  # loopback: answered
    stats = asyncio.run(servicer.Stats(pb.StatsRequest(), _PeerContext(peer)))
    assert b'"pages": 0' in stats.stats_json


# ---- bytes that are no request message (issue 35, item 11) ----------------------------------
SERVICE = pb.DESCRIPTOR.services_by_name["GlobalIndexService"]


@pytest.mark.parametrize("payload", [b"\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f"],
                         ids=["bad_tag", "truncated"])
def test_malformed_request_bytes_are_invalid_argument_on_every_method(
        payload: bytes, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    with ServerThread(ServiceConfig(admin_token=TOKEN)) as st, \
            grpc.insecure_channel(st.target) as channel:
        for method in SERVICE.methods:  # no serializers: the bytes go out as they are
            call = channel.unary_unary(f"/{SERVICE.full_name}/{method.name}")
            with pytest.raises(grpc.RpcError) as err:
                call(payload, timeout=5, metadata=AUTH)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method.name
            assert "malformed request message" in (err.value.details() or "")
        with IndexClient(st.target, admin_token=TOKEN) as client:
            assert client.stats()["pages"] == 0  # and the service goes on answering
    assert not caplog.records, "no traceback logged for a client's bad bytes"


# ---- a broken worker stays per-worker -------------------------------------------------------
def test_broken_worker_does_not_stop_timeouts_deregister_or_the_final_snapshot(
        tmp_path: Path) -> None:
    path = tmp_path / "index.snap"
    config = ServiceConfig(heartbeat_timeout_s=1.0, snapshot_path=str(path))
    broken = _unsafe(_worker("broken"), kv_events_endpoint="tcp://*:5557")
    st = ServerThread(config).start()
    try:
        state = st.server.state
        subscribed = st.run(lambda: state.register(broken))  # registered, not subscribed
        with IndexClient(st.target) as client:
            for wid in ("sgl-0", "sgl-1"):
                client.register(_worker(wid))
            client.apply(StorePages(NS, Location(WorkerId("sgl-1"), 0, Tier.GPU), None, KEYS))
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and client.stats()["service"]["workers"] > 1:
                client.heartbeat(WorkerId("sgl-1"))  # only sgl-1 keeps beating
                time.sleep(0.1)
            assert st.run(lambda: sorted(state.workers)) == ["sgl-1"]
            assert client.stats()["service"]["events"]["subscribe_failures"] >= 1
            assert st.run(lambda: state.register(_unsafe(_worker("broken-2"),
                                                         kv_events_endpoint="garbage"))) is False
            client.deregister(WorkerId("broken-2"))  # OK, not INTERNAL
            assert client.match(NS, KEYS).best_pages == 3
        assert subscribed is False
    finally:
        st.stop()  # what SIGTERM runs: it must write the snapshot
    assert [w.worker_id for w in read_snapshot(path).workers] == ["sgl-1"]


# ---- snapshots ------------------------------------------------------------------------------
def _good_index() -> dict[str, Any]:
    index = GlobalIndex()
    index.register_namespace(NS, PAGE)
    index.apply(StorePages(NS, Location(WorkerId("sgl-0"), 0, Tier.GPU), None, KEYS))
    return index.snapshot()


def _seal(body: bytes) -> bytes:
    """A file with a valid header and checksum around ``body``."""
    return struct.pack(">8sHQQ", b"RGIXSNAP", 1, len(body), xxhash.xxh64_intdigest(body)) + body


def _deep_file(depth: int = 100_000) -> bytes:
    body = msgspec.msgpack.encode(IndexSnapshot(0.0, "@@INDEX@@", []))
    placeholder = msgspec.msgpack.encode("@@INDEX@@")
    return _seal(body.replace(placeholder, b"\x91" * depth + b"\xc0"))


def _node(data: dict[str, Any], **change: Any) -> dict[str, Any]:
    """``data`` with its first node's fields replaced (parent, keys, locs, hits, stamp)."""
    out = msgspec.msgpack.decode(msgspec.msgpack.encode(data))
    node = out["namespaces"][0]["nodes"][0]
    for i, name in enumerate(("parent", "keys", "locs", "hits", "stamp")):
        if name in change:
            node[i] = change[name]
    return out


BAD_STATES = {
    "dp_inf": _node(_good_index(), locs=[["sgl-0", float("inf"), 1]]),
    "dp_float": _node(_good_index(), locs=[["sgl-0", 0.5, 1]]),
    "dp_huge": _node(_good_index(), locs=[["sgl-0", 2**40, 1]]),
    "key_float": _node(_good_index(), keys=[1e30]),
    "key_uint64": _node(_good_index(), keys=[2**64 - 1]),
    "key_bool": _node(_good_index(), keys=[True]),
    "tier_bad": _node(_good_index(), locs=[["sgl-0", 0, 7]]),
    "holder_int": _node(_good_index(), locs=[[5, 0, 1]]),
    "hits_nan": _node(_good_index(), hits=float("nan")),
    "parent_ahead": _node(_good_index(), parent=3),
    "leaf_no_location": _node(_good_index(), locs=[]),
    "half_life_0": {**_good_index(), "half_life_s": 0},
    "page_size_str": {**_good_index(), "namespaces": [{**_good_index()["namespaces"][0],
                                                       "page_size": "4"}]},
    "not_a_map": [1, 2, 3],
}


@pytest.mark.parametrize("name", sorted(BAD_STATES))
def test_restore_refuses_bad_values_with_a_typed_error(name: str) -> None:
    with pytest.raises(MalformedEventError):
        GlobalIndex.restore(BAD_STATES[name])
    sharded = {"sharded": True, "shards": [BAD_STATES[name]], "key_shard": {}}
    with pytest.raises(MalformedEventError):
        ShardedIndex.restore(sharded)


def test_sharded_routing_map_is_checked() -> None:
    good = {"sharded": True, "shards": [_good_index()] * 2, "key_shard": {NS: [[11, 1]]}}
    assert ShardedIndex.restore(good).shard_of_chain(NS, PageKey(11)) in (0, 1)
    for entry in ([11, 2], [11, -1], [2**63, 0], [11.0, 0], [11, True]):
        with pytest.raises(MalformedEventError):
            ShardedIndex.restore({**good, "key_shard": {NS: [entry]}})
    # Found by the fuzz: shards (or the map) naming other namespaces than each other.
    other = {**_good_index(), "namespaces": [{**_good_index()["namespaces"][0], "namespace": ""}]}
    for bad in ({**good, "shards": [_good_index(), other]}, {**good, "key_shard": {}}):
        with pytest.raises(MalformedEventError):
            ShardedIndex.restore(bad)


def test_deep_nesting_with_a_valid_checksum_is_a_snapshot_error() -> None:
    with pytest.raises(SnapshotError, match="undecodable"):
        decode_snapshot(_deep_file())


def test_a_stale_worker_record_is_left_out_not_the_snapshot() -> None:
    stale = _unsafe(_worker("old"), kv_events_endpoint="tcp://*:5557")
    data = encode_snapshot(IndexSnapshot(1.0, _good_index(), [stale, _worker("sgl-0")]))
    assert [w.worker_id for w in decode_snapshot(data).workers] == ["sgl-0"]


@pytest.mark.parametrize("name", ["dp_inf", "key_float", "deep"])
def test_bad_snapshot_on_start_is_refused_or_skipped_and_later_saves_work(
        tmp_path: Path, name: str) -> None:
    path = tmp_path / "index.snap"
    if name == "deep":
        path.write_bytes(_deep_file())
    else:
        body = msgspec.msgpack.encode(IndexSnapshot(0.0, BAD_STATES[name],
                                                    [_worker("sgl-0")]))
        path.write_bytes(_seal(body))
    with pytest.raises(SnapshotError):
        ServerThread(ServiceConfig(snapshot_path=str(path))).start()
    lenient = ServiceConfig(snapshot_path=str(path), start_empty_on_bad_snapshot=True)
    with ServerThread(lenient) as st, IndexClient(st.target) as client:
        assert client.stats()["pages"] == 0 and client.stats()["service"]["workers"] == 0
        client.register(_worker("sgl-1"))
        client.apply(StorePages(NS, Location(WorkerId("sgl-1"), 0, Tier.GPU), None, KEYS))
        assert client.snapshot().size_bytes > 0  # the next save works
    restored = read_snapshot(path)  # and the final one is a good file
    assert GlobalIndex.restore(restored.index).stats().pages == 3

