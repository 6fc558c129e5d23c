"""Snapshot file format: round trip, atomic replace, and clear errors for bad files (a clock that
is not a finite, non-negative number too: issue 35, item 9)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
import xxhash
from service_harness import ServerThread

from radix_global.events import RekeyedPage
from radix_global.index import GlobalIndex
from radix_global.ops import MalformedEventError, StorePages
from radix_global.registration import WorkerInfo
from radix_global.service import ServiceConfig
from radix_global.snapshot import (
    _HEADER,
    FORMAT_VERSION,
    MAGIC,
    FeedPosition,
    FeedState,
    IndexSnapshot,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    load_on_start,
    read_snapshot,
    write_snapshot,
)
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId

WORKER = WorkerInfo(
    worker_id="sgl-0", url="http://127.0.0.1:30000", model="tiny", namespace="tiny@1", page_size=4
)
STATE = {"namespaces": {"tiny@1": {"page_size": 4, "nodes": [[-5, None, [["sgl-0", 0, 1]]]]}}}


def _snap() -> IndexSnapshot:
    return IndexSnapshot(created_at=1234.5, index=STATE, workers=[WORKER])


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "index.snap"
    written = write_snapshot(path, encode_snapshot(_snap()))
    assert written.path == str(path) and written.size_bytes == path.stat().st_size
    back = read_snapshot(path)
    assert back == _snap()
    assert back.workers[0] == WORKER
    assert not [p for p in path.parent.iterdir() if p.name != "index.snap"], "temp file left"


def test_feed_positions_round_trip_and_an_older_file_has_none() -> None:
    """docs/interfaces.md, "The router's index snapshot": ``feeds`` is optional, so a file written
    before it existed still reads (no worker resumes its stream); a wrong shape is a clear error."""
    rekeyed = [RekeyedPage(b"\x01" * 32, -5, b"\x02" * 32, [(0, 1)]), RekeyedPage(7, 8, b"", [])]
    snap = IndexSnapshot(1.0, STATE, [WORKER],
                         {"sgl-0": FeedState([FeedPosition(41, 2**64 - 1)], rekeyed)})
    assert decode_snapshot(encode_snapshot(snap)) == snap
    old = msgspec.msgpack.encode({"created_at": 1.0, "index": STATE, "workers": []})

    def framed(body: bytes) -> bytes:
        return _HEADER.pack(MAGIC, FORMAT_VERSION, len(body), xxhash.xxh64_intdigest(body)) + body

    assert decode_snapshot(framed(old)).feeds == {}
    bad = msgspec.msgpack.encode({"created_at": 1.0, "index": STATE,
                                  "feeds": {"w": {"positions": [[1]]}}})
    with pytest.raises(SnapshotError, match="undecodable body"):
        decode_snapshot(framed(bad))


def test_rewrite_replaces_the_old_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "index.snap"
    write_snapshot(path, encode_snapshot(_snap()))
    newer = IndexSnapshot(created_at=2.0, index={"x": 1}, workers=[])
    write_snapshot(path, encode_snapshot(newer))
    assert read_snapshot(path) == newer


def test_truncated_file_is_a_clear_error(tmp_path: Path) -> None:
    data = encode_snapshot(_snap())
    path = tmp_path / "index.snap"
    path.write_bytes(data[:-3])
    with pytest.raises(SnapshotError, match="truncated body"):
        read_snapshot(path)
    path.write_bytes(data[:5])
    with pytest.raises(SnapshotError, match="truncated header"):
        read_snapshot(path)


def test_corrupt_body_is_a_clear_error() -> None:
    data = bytearray(encode_snapshot(_snap()))
    data[-2] ^= 0xFF
    with pytest.raises(SnapshotError, match="checksum"):
        decode_snapshot(bytes(data))


def test_other_files_and_versions_are_refused() -> None:
    data = bytearray(encode_snapshot(_snap()))
    with pytest.raises(SnapshotError, match="not an index snapshot"):
        decode_snapshot(b"GARBAGE!" + bytes(data[8:]))
    data[9] = 99  # low byte of the u16 version
    with pytest.raises(SnapshotError, match="version 99"):
        decode_snapshot(bytes(data))


def test_load_on_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "index.snap"
    assert load_on_start(path) is None  # first start: no file
    write_snapshot(path, encode_snapshot(_snap()))
    assert load_on_start(path) == _snap()

    path.write_bytes(encode_snapshot(_snap())[:-1])
    with pytest.raises(SnapshotError, match="truncated"):
        load_on_start(path)  # default: refuse to start on a bad file
    with caplog.at_level(logging.WARNING, logger="radix_global.snapshot"):
        assert load_on_start(path, start_empty_on_error=True) is None
    assert any("starting empty" in r.message for r in caplog.records)


# ---- the clock of a snapshot (issue 35, item 9) ---------------------------------------------
def _indexed() -> dict[str, Any]:
    index = GlobalIndex()
    index.register_namespace(Namespace("tiny@1"), 4)
    index.apply(StorePages(Namespace("tiny@1"), Location(WorkerId("sgl-0"), 0, Tier.GPU), None,
                           [PageKey(11), PageKey(12)]))
    index.match(Namespace("tiny@1"), [PageKey(11)], 50.0)  # a hit: a stamp to shift
    return index.snapshot()


@pytest.mark.parametrize("clock", [math.nan, math.inf, -math.inf, -1.0])
def test_a_clock_that_is_not_finite_or_is_negative_is_refused(tmp_path: Path, clock: float
                                                             ) -> None:
    """Accepted, it served hits, and the router's next snapshot (stamps shifted by ``now -
    created_at``) was unreadable: the start after that was cache-blind."""
    data = encode_snapshot(IndexSnapshot(clock, _indexed(), [WORKER]))  # a valid checksum
    with pytest.raises(SnapshotError, match="created_at"):
        decode_snapshot(data)
    path = tmp_path / "index.snap"
    path.write_bytes(data)
    with pytest.raises(SnapshotError, match="created_at"):
        ServerThread(ServiceConfig(snapshot_path=str(path))).start()
    lenient = ServiceConfig(snapshot_path=str(path), start_empty_on_bad_snapshot=True)
    with ServerThread(lenient) as st:
        assert st.run(lambda: st.server.state.index.stats().pages) == 0


def test_a_shift_that_leaves_the_clocks_range_is_refused() -> None:
    """The restore's shift (``now - created_at``) must leave every stamp finite, or the next
    snapshot is unreadable; a good shift keeps the file round-tripping."""
    good = _indexed()
    for shift in (math.nan, math.inf, -math.inf):
        with pytest.raises(MalformedEventError, match="shift"):
            GlobalIndex.restore(good, shift_s=shift)
    far = GlobalIndex.restore(good, shift_s=1e308)  # stamps at 1e308: finite
    with pytest.raises(MalformedEventError, match="out of range once shifted"):
        GlobalIndex.restore(far.snapshot(), shift_s=1e308)  # 2e308 is inf
    again = GlobalIndex.restore(good, shift_s=-1000.0)
    assert GlobalIndex.restore(again.snapshot()).stats().pages == 2
