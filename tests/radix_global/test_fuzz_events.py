"""Fuzz: KV-event payloads and frame sequences from a hostile publisher (issue 12).

Oracle, per input: decoding never raises; every op applies or is a typed ``IndexRefusal`` that
changes nothing; the index still snapshots, restores and answers on the wire (no value it cannot
carry got in); a valid event afterwards still applies. For frame sequences (the subscriber's
seq handling): no exception escapes, the seq stays an int64, and a valid next message, and then
a restarted publisher's, still apply.

Counts per target go to ``RADIX_FUZZ_REPORT`` (see ``fuzz_tally.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from fuzz_tally import Tally, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radix_global import events, keys
from radix_global.events import EngineKind, EventDecoder
from radix_global.index import GlobalIndex
from radix_global.ops import IndexRefusal
from radix_global.registration import WorkerInfo
from radix_global.snapshot import IndexSnapshot, decode_snapshot, encode_snapshot
from radix_global.subscriber import KVEventSubscriber, _Publisher
from radix_global.types import Namespace, WorkerId
from radix_global.wire import match_to_pb

pytestmark = pytest.mark.timeout(300)
NS = Namespace("m@1")
PS = 4
W = WorkerId("w0")
CANARY = list(range(1000, 1008))  # 2 pages stored before every input
FRESH = list(range(5000, 5012))  # 3 pages stored after it: must apply
enc = msgspec.msgpack.encode
TALLIES = {name: Tally(name) for name in ("kv_event_payloads", "kv_event_frames")}


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    for tally in TALLIES.values():
        tally.write()


def store(tokens: list[int], **kw: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": keys.page_keys(tokens, PS),
            "parent_block_hash": None, "token_ids": tokens, "block_size": PS, "lora_id": None,
            "medium": "GPU", **kw}


FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
          "cache_salt", "lora_name", "extra_keys", "group_idx", "type")
ints = st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from([0, 1, -1, PS, 2**63 - 1,
                                                                     2**63, 2**64 - 1, 2**32]))
leaf = st.one_of(st.none(), st.booleans(), ints, st.floats(), st.text(max_size=12),
                 st.binary(max_size=12), st.sampled_from(["GPU", "CPU", "L3", "BlockStored",
                                                          "BlockRemoved", "AllBlocksCleared"]))
values = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=25)


@st.composite
def event(draw: Any) -> Any:
    """A valid event with some fields replaced by arbitrary values, in map or array form."""
    kind = draw(st.sampled_from(["stored", "salted", "removed", "cleared", "raw"]))
    if kind == "raw":
        return draw(values)
    tokens = draw(st.sampled_from([CANARY, CANARY[:4], list(range(50, 58))]))  # never FRESH
    ev: dict[str, Any] = {
        "stored": lambda: store(tokens),
        "salted": lambda: store(tokens, cache_salt="s"),
        "removed": lambda: {"type": "BlockRemoved", "block_hashes": keys.page_keys(tokens, PS)},
        "cleared": lambda: {"type": "AllBlocksCleared"},
    }[kind]()
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        ev[name] = draw(values)
    if draw(st.booleans()):
        return [ev.get("type"), *(ev.get(f) for f in FIELDS[:-1])]
    return ev


def _deep(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


payloads = st.one_of(
    st.binary(max_size=256),
    values.map(enc),
    st.builds(lambda ts, evs, rank: enc([ts, evs, rank]), st.one_of(st.floats(), ints, values),
              st.lists(event(), max_size=4), st.one_of(st.none(), ints, values)),
    st.builds(lambda evs, rank: enc({"ts": 1.0, "events": evs, "attn_dp_rank": rank}),
              st.lists(event(), max_size=4), st.one_of(st.none(), ints)),
    st.integers(1, 300_000).map(_deep),
    st.integers(1, 3000).map(lambda d: enc([1.0, [], 0])[:-2] + b"\x91" + _deep(d)),
)


def _fresh_decoder(engine: str, dp_size: int) -> tuple[GlobalIndex, EventDecoder]:
    index = GlobalIndex()
    index.register_namespace(NS, PS)
    decoder = EventDecoder(W, NS, PS, EngineKind(engine), dp_size=dp_size,
                           lora_extra_keys={"ad": "k"})
    for op in decoder.decode(enc([0.0, [store(CANARY)], 0])).ops:
        index.apply(op)
    return index, decoder


def _still_sound(index: GlobalIndex, decoder: EventDecoder) -> bool:
    """Nothing the wire or a snapshot cannot carry got in, and a valid store still applies."""
    for tokens in (CANARY, FRESH):
        match_to_pb(index.match(NS, keys.page_keys(tokens, PS), 1.0))
    data = decode_snapshot(encode_snapshot(IndexSnapshot(0.0, index.snapshot(), [])))
    GlobalIndex.restore(data.index)
    fresh = keys.page_keys(FRESH, PS)
    tree = index._trees[NS]
    if any(k in tree for k in fresh):
        return True  # the input itself stored these keys (a replayed example can know them)
    for op in decoder.decode(enc([2.0, [store(FRESH, medium="CPU")], 0])).ops:
        index.apply(op)
    return index.match(NS, fresh, 2.0).best_pages == 3


@settings(max_examples=examples(400), suppress_health_check=list(HealthCheck))
@given(payload=payloads, engine=st.sampled_from(["sglang", "vllm"]), dp_size=st.integers(1, 3))
def test_fuzz_kv_event_payloads(payload: bytes, engine: str, dp_size: int) -> None:
    tally = TALLIES["kv_event_payloads"]
    index, decoder = _fresh_decoder(engine, dp_size)
    with tally.timed():
        try:
            decoded = decoder.decode(payload)
        except Exception:
            tally.add("crash")
            raise
        refused = bool(decoded.refusals)
        for op in decoded.ops:
            before = index.snapshot()
            try:
                index.apply(op)
            except IndexRefusal:
                refused = True
                if index.snapshot() != before:
                    tally.add("loss")
                    raise AssertionError(f"a refused op changed the index: {op!r}") from None
            except Exception:
                tally.add("crash")
                raise
        if sum(decoder.refused.values()) < len(decoded.refusals):
            tally.add("loss")
            raise AssertionError("a refusal was not counted")
        try:
            sound = _still_sound(index, decoder)
        except Exception:
            tally.add("loss")
            raise
        if not sound:
            tally.add("loss")
            raise AssertionError("a valid store after the input did not apply")
        tally.add("refused" if refused else "ok")


# ---- frame sequences through the subscriber's seq handling ------------------------------------
def _valid(tokens: list[int]) -> bytes:
    return enc([1.0, [store(tokens)], 0])


seqs = st.one_of(st.integers(0, 20), st.integers(0, 2**64 - 1),
                 st.sampled_from([2**63 - 1, 2**63, 2**64 - 1]))
frames = st.one_of(
    st.tuples(seqs, st.one_of(payloads, st.sampled_from([_valid(CANARY), _valid(CANARY[:4])])))
    .map(lambda t: [b"kv-events", t[0].to_bytes(8, "big"), t[1]]),
    st.lists(st.binary(max_size=12), max_size=5),  # wrong frame counts and seq widths
)


async def _run_frames(messages: list[list[bytes]]) -> tuple[bool, bool]:
    index = GlobalIndex()
    sub = KVEventSubscriber(index, timeout_s=1e9)
    info = WorkerInfo(worker_id=W, url="http://127.0.0.1:1", model="m", namespace=NS,
                      page_size=PS)
    await sub.add_worker(info)  # no endpoint: no socket, messages are handed in directly
    feed = sub._feeds[W]
    pub = _Publisher(0, "inproc://fuzz", None, feed.decoder)
    for msg in messages:
        await sub._on_message(feed, pub, msg)
        assert pub.last_seq is None or 0 <= pub.last_seq < 2**63
    nxt = 0 if pub.last_seq is None else pub.last_seq + 1
    fresh = True
    if nxt < 2**63:  # else the input ended the int64 seq space: only a restart can go on
        await sub._on_message(feed, pub, [b"kv-events", nxt.to_bytes(8, "big"), _valid(FRESH)])
        fresh = index.match(NS, keys.page_keys(FRESH, PS), 1.0).best_pages == 3
    back = max(0, min(nxt, 2**63) - 1)  # a restarted publisher (seq back, or seq 0 again)
    await sub._on_message(feed, pub, [b"kv-events", back.to_bytes(8, "big"), _valid(CANARY)])
    restarted = index.match(NS, keys.page_keys(CANARY, PS), 1.0).best_pages == 2
    return fresh, restarted


@settings(max_examples=examples(250), suppress_health_check=list(HealthCheck))
@given(messages=st.lists(frames, max_size=8))
def test_fuzz_kv_event_frames(messages: list[list[bytes]]) -> None:
    tally = TALLIES["kv_event_frames"]
    with tally.timed():
        try:
            fresh, restarted = asyncio.run(_run_frames(messages))
        except Exception:
            tally.add("crash")
            raise
        if not (fresh and restarted):
            tally.add("loss")
            raise AssertionError(f"feed stuck after the input (fresh={fresh}, "
                                 f"restart={restarted})")
        bad = any(len(m) != 3 or len(m[1]) != 8 or int.from_bytes(m[1], "big") >= 2**63
                  for m in messages)
        tally.add("refused" if bad else "ok")


# batches of events, in both forms, more often than ``payloads`` draws them
batches = st.builds(lambda ts, evs, rank: enc([ts, evs, rank]), st.sampled_from([0.0, 1, 2.5]),
                    st.lists(event(), min_size=1, max_size=4), st.sampled_from([0, 1, None]))


@settings(max_examples=examples(400), suppress_health_check=list(HealthCheck))
@given(payload=st.one_of(payloads, batches, batches), engine=st.sampled_from(["sglang", "vllm"]),
       dp_size=st.integers(1, 3))
def test_token_ids_left_undecoded_until_needed_change_no_outcome(
        payload: bytes, engine: str, dp_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``events._envelope`` leaves each store's ``token_ids`` undecoded until a re-key needs
    them: the decoder's outcome (ops, refusal reasons, readability) is the one of decoding the
    whole payload at once, the reference."""
    _, fast = _fresh_decoder(engine, dp_size)
    got = fast.decode(payload)
    with monkeypatch.context() as m:
        m.setattr(events, "_envelope", lambda payload, decoder: decoder.decode(payload))
        _, whole = _fresh_decoder(engine, dp_size)
        want = whole.decode(payload)
    assert (repr(got.ts), got.dp_rank, got.ops, got.unreadable) == \
        (repr(want.ts), want.dp_rank, want.ops, want.unreadable)  # repr: a NaN ts equals itself
    assert [r.reason for r in got.refusals] == [r.reason for r in want.refusals]


def test_undecodable_token_ids_fail_only_the_event_that_reads_them() -> None:
    """Token ids are read only to re-key: a plain SGLang store whose ``token_ids`` are no msgpack
    value (an invalid UTF-8 string here) still applies, a salted one is refused as malformed and
    the batch's other events still decode (decoding the whole payload refused all of it)."""
    def batch(*events: list[Any]) -> bytes:
        sentinel = enc([987654321])  # token_ids of each store, swapped for undecodable bytes
        return enc([1.0, list(events), 0]).replace(sentinel, b"\x91\xa2\xff\xff")

    tokens = list(range(50, 58))
    plain = ["BlockStored", keys.page_keys(tokens, PS), None, [987654321], PS, None, "GPU"]
    salted = [*plain, "s"]
    _, decoder = _fresh_decoder("sglang", 1)
    got = decoder.decode(batch(plain))
    assert not got.unreadable and not got.refusals and len(got.ops) == 1
    got = decoder.decode(batch(salted, ["BlockRemoved", keys.page_keys(CANARY, PS)]))
    assert not got.unreadable and [r.reason for r in got.refusals] == ["malformed"]
    assert len(got.ops) == 1  # the removal
