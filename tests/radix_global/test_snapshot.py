"""Snapshot file format: round trip, atomic replace, and clear errors for bad files."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest
import xxhash

from radix_global.events import RekeyedPage
from radix_global.registration import WorkerInfo
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
    """docs/interfaces.md s.18: ``feeds`` is optional, so a file written before it existed
    still reads (no worker resumes its stream); a wrong shape is a clear error."""
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
