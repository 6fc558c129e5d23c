"""Fuzz: snapshot files (issue 12).

Inputs: random bytes; a valid header and checksum around random msgpack; a real snapshot with
one value replaced anywhere in its index state (huge or float ints, inf/nan, wrong types, deep
nesting); a real snapshot with random bytes flipped. Oracle, per file: what the service's start
runs (``decode_snapshot`` then ``restore_index``) either raises a ``SnapshotError`` or restores an
index that answers on the wire, snapshots again, and whose next snapshot file restores the same.
Counts go to ``RADIX_FUZZ_REPORT`` (see ``fuzz_tally.py``).
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import pytest
import xxhash
from fuzz_tally import Tally, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radix_global.index import GlobalIndex
from radix_global.keys import page_keys
from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.service_state import new_index, restore_index
from radix_global.shards import ShardedIndex
from radix_global.snapshot import IndexSnapshot, SnapshotError, decode_snapshot, encode_snapshot
from radix_global.types import Location, Namespace, PoolId, Tier, WorkerId
from radix_global.wire import hot_to_pb, match_to_pb

pytestmark = pytest.mark.timeout(300)
NS = Namespace("tiny@1")
PAGE = 4
PROMPTS = [page_keys(list(range(s, s + 12)), PAGE) for s in (0, 100, 200)]
TALLY = Tally("snapshot_files")


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    TALLY.write()


def _state(shards: int) -> Any:
    index = new_index(shards)
    index.register_namespace(NS, PAGE)
    for i, keys in enumerate(PROMPTS):
        index.apply(StorePages(NS, Location(WorkerId(f"sgl-{i % 2}"), i, Tier(1 + i % 2)),
                               None, keys))
    index.apply(StorePages(NS, Location(PoolId("pool"), 0, Tier.POOL), PROMPTS[0][0],
                           PROMPTS[0][1:]))
    index.match(NS, PROMPTS[0], 5.0)
    return msgspec.msgpack.decode(msgspec.msgpack.encode(index.snapshot()))


WORKER = WorkerInfo(worker_id="sgl-0", url="http://127.0.0.1:1", model="tiny", namespace=NS,
                    page_size=PAGE)
STATES = {1: _state(1), 2: _state(2)}


def _seal(body: bytes) -> bytes:
    return struct.pack(">8sHQQ", b"RGIXSNAP", 1, len(body), xxhash.xxh64_intdigest(body)) + body


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in plain data: list indexes and map keys."""
    out = [prefix]
    if isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    elif isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    return out


def _replace(data: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    out = list(data) if isinstance(data, list) else dict(data)
    out[path[0]] = _replace(data[path[0]], path[1:], new)
    return out


class _Deep:
    """Stands for a deeply nested value: spliced in as raw msgpack after encoding."""

    MARK = "@@deep@@"


values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
              st.sampled_from([float("inf"), float("-inf"), float("nan"), 2**63, -1, 0, 1e30,
                               2**32, 2**64 - 1, _Deep.MARK]),
              st.text(max_size=10), st.binary(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10)


def _file(state: Any, depth: int) -> bytes:
    body = msgspec.msgpack.encode(IndexSnapshot(1.0, state, [WORKER]))
    mark = msgspec.msgpack.encode(_Deep.MARK)
    return _seal(body.replace(mark, b"\x91" * depth + b"\xc0"))


@st.composite
def files(draw: Any) -> tuple[bytes, int]:
    shards = draw(st.sampled_from([1, 2]))
    kind = draw(st.sampled_from(["bytes", "sealed_random", "mutated", "flipped", "retyped"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300)), shards
    if kind == "sealed_random":
        return _seal(msgspec.msgpack.encode(draw(values)).replace(
            msgspec.msgpack.encode(_Deep.MARK), b"\x91" * 50_000 + b"\xc0")), shards
    state = STATES[shards]
    if kind == "flipped":
        data = bytearray(_file(state, 1))
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        return bytes(data), shards
    path = draw(st.sampled_from(_paths(state)))
    if kind == "retyped":  # a value of the same type, any range: the checks of ranges
        old = _get(state, path)
        same = {int: st.integers(-(2**63), 2**64 - 1), float: st.floats(),
                str: st.text(max_size=10), bool: st.booleans()}.get(type(old))
        if same is not None:
            return _file(_replace(state, path, draw(same)), 1), shards
    depth = draw(st.sampled_from([10, 900, 5000, 100_000]))
    return _file(_replace(state, path, draw(values)), depth), shards


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        data = data[step]
    return data


def _serves(index: Any) -> None:
    """The restored index answers on the wire, and its next snapshot restores the same."""
    spaces = index.namespaces() if isinstance(index, GlobalIndex) else list(index._key_shard)
    for ns in spaces:  # a renamed namespace is valid data; a query names what is there
        for keys in PROMPTS:
            match_to_pb(index.match(ns, keys, 10.0))
        hot_to_pb(index.hot_prefixes(ns, 5, 10.0))
    again = decode_snapshot(encode_snapshot(IndexSnapshot(2.0, index.snapshot(), [WORKER])))
    back = restore_index(again.index, len(index.shards) if isinstance(index, ShardedIndex) else 1)
    assert back.snapshot() == index.snapshot()


@settings(max_examples=examples(300), suppress_health_check=list(HealthCheck))
@given(case=files())
def test_fuzz_snapshot_files(case: tuple[bytes, int]) -> None:
    data, shards = case
    with TALLY.timed():
        try:
            snap = decode_snapshot(data, "fuzz.snap")
            index = restore_index(snap.index, shards)
        except SnapshotError:
            TALLY.add("refused")
            return
        except Exception:
            TALLY.add("crash")
            raise
        try:
            _serves(index)
        except Exception:
            TALLY.add("loss")  # accepted, but it poisoned what comes next
            raise
        TALLY.add("ok")
