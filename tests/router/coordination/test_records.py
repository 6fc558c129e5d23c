"""Records in the coordination service (router/coordination/records.py): what a reader refuses."""

from __future__ import annotations

import pytest

from radix_global.registration import WorkerInfo, encode_worker_info
from radix_global.types import PageKey, WorkerId
from router.coordination import records as rec
from router.coordination.records import Keys, Kind, RecordError
from router.routing.link_fit import LinkStats
from router.routing.load_view import SlotLoad

INFO = WorkerInfo(worker_id="w1", url="http://127.0.0.1:1", model="m", namespace="m@1",
                  page_size=4)


def worker(registration: str | None = None, v: int = rec.SCHEMA) -> bytes:
    return rec.encode(rec.WorkerRecord(v, registration or encode_worker_info(INFO).decode()))


def test_keys_name_one_cluster_and_refuse_bad_cluster_names():
    keys = Keys("c1")
    assert keys.key(Kind.ALIAS, "m@1:-42") == "rg:c1:alias:m@1:-42"
    assert keys.index(Kind.WORKER) == "rg:c1:ids:worker"
    for cluster in ("", "a:b", "x" * 65, "tab\there"):
        with pytest.raises(ValueError):
            Keys(cluster)


def test_a_worker_record_round_trips():
    record = rec.decode(worker(), rec.WorkerRecord, "w1")
    assert rec.worker_info(record, "w1") == INFO


@pytest.mark.parametrize("raw, ident, why", [
    (b"not json", "w1", "WorkerRecord"),
    (b"{" + b" " * rec.MAX_RECORD_BYTES + b"}", "w1", "over"),
    (worker(v=2), "w1", "schema"),
    (b'{"v": 1, "registration": "{}", "extra": 1}', "w1", "WorkerRecord"),
    (None, "w1", "no value"),
])
def test_malformed_records_are_refused(raw, ident, why):
    with pytest.raises(RecordError, match=why):
        rec.decode(raw, rec.WorkerRecord, ident)


def test_a_registration_that_does_not_check_or_names_another_worker_is_refused():
    with pytest.raises(RecordError, match="registration"):
        rec.worker_info(rec.decode(worker(), rec.WorkerRecord, "w2"), "w2")
    bad = encode_worker_info(INFO).decode().replace("m@1", "no-version")
    with pytest.raises(RecordError):
        rec.worker_info(rec.decode(worker(bad), rec.WorkerRecord, "w1"), "w1")


def test_a_record_naming_another_key_is_refused():
    raw = rec.encode(rec.DrainRecord(rec.SCHEMA, "w1"))
    with pytest.raises(RecordError, match="key names"):
        rec.decode(raw, rec.DrainRecord, "w2")


def test_load_records_round_trip_and_refuse_negative_load():
    slot = (WorkerId("w1"), 0)
    record = rec.decode(rec.encode(rec.load_record("r", 7, {slot: SlotLoad(1, 1, 30, 0, 0)})),
                        rec.LoadRecord, "r")
    assert rec.load_slots(record) == {slot: SlotLoad(1, 1, 30, 0, 0)}
    bad = rec.LoadRecord(rec.SCHEMA, "r", 8, [rec.SlotLoadRecord("w1", 0, -1, 0, 0, 0, 0)])
    with pytest.raises(RecordError, match="negative"):
        rec.load_slots(bad)
    many = rec.LoadRecord(rec.SCHEMA, "r", 9, [rec.SlotLoadRecord("w", 0, 1, 0, 0, 0, 0)]
                          * (rec.MAX_LOAD_SLOTS + 1))
    with pytest.raises(RecordError, match="slots"):
        rec.decode(rec.encode(many), rec.LoadRecord, "r", max_bytes=1 << 30)


def test_routed_tips_ride_on_a_load_record_bounded_and_checked():
    slot, tips = (WorkerId("w1"), 0), [((WorkerId("w1"), 0), PageKey(-(1 << 63)))]
    record = rec.decode(rec.encode(rec.load_record("r", 7, {}, tips)), rec.LoadRecord, "r")
    assert rec.load_tips(record) == tips
    many = [(slot, PageKey(i)) for i in range(rec.MAX_ROUTED_TIPS + 5)]
    record = rec.load_record("r", 8, {}, many)  # the newest kept
    assert rec.load_tips(record) == many[5:]
    for bad in (rec.RoutedTipRecord("w1", -1, 5), rec.RoutedTipRecord("w1", 0, 1 << 63)):
        with pytest.raises(RecordError, match="routed tip"):
            rec.load_tips(rec.LoadRecord(rec.SCHEMA, "r", 9, [], [bad]))
    over = rec.LoadRecord(rec.SCHEMA, "r", 9, [], [rec.RoutedTipRecord("w", 0, 1)]
                          * (rec.MAX_ROUTED_TIPS + 1))
    with pytest.raises(RecordError, match="routed tips"):
        rec.decode(rec.encode(over), rec.LoadRecord, "r")
    old = b'{"v":1,"router_id":"r","seq":1,"slots":[]}'  # a record without tips reads
    assert rec.load_tips(rec.decode(old, rec.LoadRecord, "r")) == []


def test_notices_round_trip_with_and_without_the_record_inline():
    plain = rec.Notice("r1", Kind.WORKER, "w:1")  # an id may contain ':'
    assert rec.parse_notice(plain.encode()) == plain
    load = rec.Notice("r1", Kind.LOAD, "r1", '{"schema": 1}\nmore')
    assert rec.parse_notice(load.encode()) == load  # the record keeps its own newlines
    assert rec.parse_notice(load.encode().decode()) == load  # pub/sub may hand over str


@pytest.mark.parametrize("raw", [b"r1 nosuchkind:x", b"r1 worker:", b"r1", b"", b" worker:x"])
def test_malformed_notices_are_refused(raw):
    with pytest.raises(RecordError):
        rec.parse_notice(raw)


def test_only_a_load_notice_is_split_at_a_newline():
    odd = rec.Notice("r1", Kind.WORKER, "w\nx")  # not a load: the whole id, never an inline part
    assert rec.parse_notice(odd.encode()) == odd


def test_a_peers_load_is_applied_from_its_notice_without_a_read():
    import asyncio

    from router.coordination.config import CoordinationConfig
    from router.coordination.link import Coordinator

    class NoReads:
        async def get(self, key: str) -> bytes:
            raise AssertionError(f"read {key}: the notice carried the record")

    ended: list[int] = []
    coord = Coordinator(CoordinationConfig(url="redis://127.0.0.1:1/0"), "me", "v", "d",
                        shared=None, own_load=dict)  # type: ignore[arg-type]
    coord.redis = NoReads()  # type: ignore[assignment]
    coord.reader.on_peer_load = lambda: ended.append(1)
    slot = (WorkerId("w1"), 0)
    for seq, prefilling in ((1, 2), (2, 1)):
        record = rec.encode(rec.load_record("peer", seq, {slot: SlotLoad(2, prefilling)}))
        notice = rec.Notice("peer", Kind.LOAD, "peer", record.decode())
        asyncio.run(coord._notice(notice.encode()))
    assert coord.peers.load(slot, 0.0)[:2] == (2, 1)
    assert ended == [1]  # the second publication ended one prefill: the gate is pumped once
    told: list[tuple[object, int]] = []
    coord.reader.on_peer_routed = lambda s, tip: told.append((s, tip))
    record = rec.encode(rec.load_record("peer", 3, {}, [(slot, PageKey(42))]))
    notice = rec.Notice("peer", Kind.LOAD, "peer", record.decode()).encode()
    for _ in range(2):  # the same publication again (a resync's read) tells nothing new
        asyncio.run(coord._notice(notice))
    assert told == [(slot, 42)]
    coord.peers.drop("peer")  # read again from scratch (a restart, an expiry): maybe old news
    record = rec.encode(rec.load_record("peer", 4, {}, [(slot, PageKey(43))]))
    asyncio.run(coord._notice(rec.Notice("peer", Kind.LOAD, "peer", record.decode()).encode()))
    assert told == [(slot, 42)] and coord.peers.routers() == ["peer"]
    asyncio.run(coord._notice(b"peer nosuchkind:x"))
    assert coord.refused["notice"] == 1


def test_link_records_round_trip_and_refuse_bad_numbers():
    links = {("domain:r1", "host:10.0.0.2"): LinkStats(4, 3.9, 4e6, 4e-3, 5e12, 5.0),
             ("host:10.0.0.2", "host:10.0.0.2"): LinkStats(1, 1.0, 1.0, 1.0, 1.0, 1.0)}
    raw = rec.encode(rec.link_record("r0", links))
    assert rec.link_stats(rec.decode(raw, rec.LinkRecord, "r0")) == links
    with pytest.raises(RecordError, match="names"):
        rec.decode(raw, rec.LinkRecord, "r1")
    for bad in ({"a": "x" * 201}, {"samples": -1}, {"samples": 0}, {"w": float("nan")},
                {"w": 0.5}, {"x": 0.0}, {"y": 0.0}, {"xy": -1.0}, {"y": float("inf")},
                {"xx": 1e41}):
        entry = {"a": "a", "b": "b", "samples": 4, "w": 1.0, "x": 1.0, "y": 1.0, "xx": 1.0,
                 "xy": 1.0, **bad}
        record = rec.LinkRecord(rec.SCHEMA, "r0", [rec.LinkStatsRecord(**entry)])
        with pytest.raises(RecordError, match="bad link"):
            rec.link_stats(record)
    many = rec.LinkRecord(rec.SCHEMA, "r0", [rec.LinkStatsRecord("a", "b", 1, 1, 1, 1, 1, 1)]
                          * (rec.MAX_LINKS + 1))
    with pytest.raises(RecordError, match="links, over"):
        rec.decode(rec.encode(many), rec.LinkRecord, "r0")
