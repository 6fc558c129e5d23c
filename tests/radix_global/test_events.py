"""EventDecoder: both engines, both encodings, re-keying, refusals.

Payloads are built with local msgspec structs shaped like SGLang's and vLLM's published ones (tagged
maps and tag-first arrays); ``test_real_sglang_*`` encode with SGLang's own structs and cache.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import msgspec
import pytest

from radix_global import keys
from radix_global.events import EngineKind, EventDecoder, UnknownLoraError, UnsupportedEventError
from radix_global.ops import (
    ClearHolder,
    MalformedEventError,
    PageSizeMismatchError,
    RemovePages,
    StorePages,
    UnknownParentError,
)
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId

NS = Namespace("m@1")
W = WorkerId("w0")
PS = 4
enc = msgspec.msgpack.encode


def _tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 50_000) for _ in range(n)]


def sgl_stored(hashes: list[Any], parent: Any, tokens: list[int], **kw: Any) -> dict[str, Any]:
    ev = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": kw.pop("block_size", PS),
        "lora_id": None,
    }
    ev.update(kw)
    return ev  # fmt: skip


def as_array(ev: dict[str, Any], order: tuple[str, ...]) -> list[Any]:
    """Tag-first array encoding (msgspec ``array_like=True, tag=True``), trailing defaults cut."""
    vals = [ev.get(k) for k in order]
    while vals and vals[-1] is None:
        vals.pop()
    return [ev["type"], *vals]


SGL_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
              "medium", "cache_salt", "session_id", "lora_name")  # fmt: skip
VLLM_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
               "medium", "lora_name", "extra_keys", "group_idx")  # fmt: skip


def batch(events: list[Any], rank: int | None = 0, as_map: bool = False) -> bytes:
    if as_map:
        return enc({"ts": 1.5, "events": events, "data_parallel_rank": rank})
    return enc([1.5, events, rank])


def decoder(engine: str = "sglang", **kw: Any) -> EventDecoder:
    return EventDecoder(W, NS, PS, engine, **kw)


def test_plain_sglang_hashes_are_page_keys_without_rehash() -> None:
    toks = _tokens(12)
    pk = keys.page_keys(toks, PS)
    d = decoder()
    out = d.decode(batch([sgl_stored(pk, None, toks, medium="GPU")], rank=2))
    assert out.ops == [StorePages(NS, Location(W, 2, Tier.GPU), None, pk)]
    assert d.rekeyed_entries == 0 and out.refusals == [] and out.ts == 1.5
    # token_ids are not even looked at for plain SGLang stores: only the hashes matter.
    out = d.decode(batch([sgl_stored([PageKey(7)], pk[-1], [0, 0, 0, 0])]))
    assert out.ops[0] == StorePages(NS, Location(W, 0, Tier.GPU), pk[-1], [PageKey(7)])


@pytest.mark.parametrize("as_map", [False, True])
def test_sglang_array_and_map_encodings_agree(as_map: bool) -> None:
    toks = _tokens(8)
    ev = sgl_stored([11, 12], None, toks, medium="CPU_PINNED", cache_salt="s")
    rm = {"type": "BlockRemoved", "block_hashes": [12], "medium": "CPU_PINNED"}
    events = (
        [ev, rm] if as_map else [as_array(ev, SGL_STORED), as_array(rm, ("block_hashes", "medium"))]
    )
    out = decoder().decode(batch(events, as_map=as_map))
    salted = keys.page_keys(toks, PS, cache_salt="s")
    assert out.ops == [
        StorePages(NS, Location(W, 0, Tier.HOST), None, salted),
        RemovePages(NS, Location(W, 0, Tier.HOST), [salted[1]]),
    ]


def test_salted_chain_rekeyed_across_events_and_freed() -> None:
    toks = _tokens(16, seed=1)
    d = decoder()
    e1 = sgl_stored([101, 102], None, toks[:8], cache_salt="s")
    e2 = sgl_stored([103, 104], 102, toks[8:], cache_salt="s")
    ops = d.decode(batch([e1, e2])).ops
    want = keys.page_keys(toks, PS, cache_salt="s")
    assert ops[0].keys == want[:2] and ops[1].keys == want[2:]  # type: ignore[union-attr]
    assert ops[1].parent == want[1]  # type: ignore[union-attr]
    assert d.rekeyed_entries == 4
    rm = d.decode(batch([{"type": "BlockRemoved", "block_hashes": [104, 103], "medium": None}]))
    assert rm.ops == [RemovePages(NS, Location(W, 0, Tier.GPU), [want[3], want[2]])]
    assert d.rekeyed_entries == 2
    assert d.decode(batch([{"type": "AllBlocksCleared"}])).ops == [ClearHolder(W, None, 0)]
    assert d.rekeyed_entries == 0


def test_a_ranks_reset_clears_only_that_rank() -> None:
    """``AllBlocksCleared`` on one data-parallel rank's stream: that rank's pages leave the index
    and the re-keying map; the other rank's stay, and its later removal still translates."""
    toks = _tokens(8, seed=3)
    d = decoder()
    for rank in (0, 1):
        d.decode(batch([sgl_stored([201, 202], None, toks, cache_salt="s")], rank=rank))
    assert d.decode(batch([{"type": "AllBlocksCleared"}], rank=1)).ops == [
        ClearHolder(W, None, 1)]
    assert d.rekeyed_entries == 2  # rank 0's copies keep the translation
    out = d.decode(batch([{"type": "BlockRemoved", "block_hashes": [202], "medium": None}]))
    assert out.ops == [
        RemovePages(NS, Location(W, 0, Tier.GPU), [keys.page_keys(toks, PS, cache_salt="s")[1]])]


def test_copies_at_two_tiers_keep_translation_alive() -> None:
    toks = _tokens(4)
    d = decoder()
    d.decode(batch([sgl_stored([5], None, toks, cache_salt="s", medium=m) for m in ("GPU", "CPU")]))
    d.decode(batch([{"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"}]))
    out = d.decode(batch([{"type": "BlockRemoved", "block_hashes": [5], "medium": "CPU"}]))
    assert out.ops == [
        RemovePages(NS, Location(W, 0, Tier.HOST), keys.page_keys(toks, PS, cache_salt="s"))
    ]
    assert d.rekeyed_entries == 0


@pytest.mark.parametrize("as_map", [False, True])
def test_vllm_events_rekeyed_bytes_and_int_hashes(as_map: bool) -> None:
    toks = _tokens(12, seed=2)
    d = decoder("vllm")
    e1 = {"type": "BlockStored", "block_hashes": [b"\x01" * 32, 77], "parent_block_hash": None,
          "token_ids": toks[:8], "block_size": PS, "lora_id": None, "medium": "GPU",
          "lora_name": None, "extra_keys": [None, None]}  # fmt: skip
    e2 = dict(e1, block_hashes=[b"\x03" * 32], parent_block_hash=77, token_ids=toks[8:],
              extra_keys=None)  # fmt: skip
    rm = {"type": "BlockRemoved", "block_hashes": [b"\x01" * 32, b"\x09" * 32], "medium": "GPU"}
    events = [e1, e2, rm]
    if not as_map:
        events = [
            as_array(e1, VLLM_STORED),
            as_array(e2, VLLM_STORED),
            as_array(rm, ("block_hashes", "medium")),
        ]
    out = d.decode(batch(events, rank=1, as_map=as_map))
    want = keys.page_keys(toks, PS)
    loc = Location(W, 1, Tier.GPU)
    assert out.ops == [
        StorePages(NS, loc, None, want[:2]),
        StorePages(NS, loc, want[1], want[2:]),
        RemovePages(NS, loc, [want[0]]),  # the never-stored hash is dropped
    ]


def test_vllm_array_position_of_lora_name_differs_from_sglang() -> None:
    toks = _tokens(4)
    ek = keys.lora_extra_key("ad", "/p")
    ev = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": toks,
          "block_size": PS, "lora_id": None, "medium": "GPU", "lora_name": "ad"}  # fmt: skip
    out = decoder("vllm", lora_extra_keys={"ad": ek}).decode(batch([as_array(ev, VLLM_STORED)]))
    assert out.ops[0].keys == keys.page_keys(toks, PS, extra_key=ek)  # type: ignore[union-attr]
    # Same array read with SGLang's field order: position 7 is cache_salt, so it is a salted store.
    out = decoder("sglang").decode(batch([as_array(ev, VLLM_STORED)]))
    assert out.ops[0].keys == keys.page_keys(toks, PS, cache_salt="ad")  # type: ignore[union-attr]


def test_lora_rekeyed_with_configured_extra_key_else_refused() -> None:
    toks = _tokens(8)
    ek = keys.lora_extra_key("ad", "/p")
    ev = sgl_stored([1, 2], None, toks, lora_name="ad")
    out = decoder(lora_extra_keys={"ad": ek}).decode(batch([ev]))
    assert out.ops[0].keys == keys.page_keys(toks, PS, extra_key=ek)  # type: ignore[union-attr]
    d = decoder()
    out = d.decode(batch([ev]))
    assert out.ops == [] and isinstance(out.refusals[0], UnknownLoraError)
    assert d.refused == {"unknown_lora": 1}


def test_there_is_no_dynamo_event_format() -> None:
    """No worker can declare SGLang's dynamo event format (``WorkerInfo.engine`` is
    sglang|vllm|other), so the decoder has no such kind."""
    assert {k.value for k in EngineKind} == {"sglang", "vllm"}
    with pytest.raises(ValueError):
        decoder("sglang-dynamo")


@pytest.mark.parametrize(
    ("medium", "tier"),
    [(None, Tier.GPU), ("GPU", Tier.GPU), ("CPU", Tier.HOST), ("CPU_PINNED", Tier.HOST),
     ("DISK", Tier.POOL), ("EXTERNAL", Tier.POOL), ("L3", Tier.POOL), ("POOL", Tier.POOL)],
)  # fmt: skip
def test_medium_to_tier(medium: str | None, tier: Tier) -> None:
    out = decoder().decode(batch([sgl_stored([1], None, [0] * PS, medium=medium)]))
    assert out.ops[0].location.tier == tier  # type: ignore[union-attr]


def test_a_pool_stream_with_a_disk_tier_puts_its_disk_events_on_the_disk_holder() -> None:
    """docs/interfaces.md, "The persistent disk tier under the pool": DISK on a pool stream names
    the pool's disk tier, POOL the pool; a stream without a disk holder keeps DISK on its own
    holder."""
    d = EventDecoder(PoolId("pool"), NS, PS, disk_holder=PoolId("pool+disk"))
    out = d.decode(batch([sgl_stored([1], None, [0] * PS, medium="DISK"),
                          sgl_stored([2], None, [0] * PS, medium="POOL")]))
    assert [(op.location.holder, op.location.tier) for op in out.ops] == [  # type: ignore[union-attr]
        ("pool+disk", Tier.POOL), ("pool", Tier.POOL)]
    plain = EventDecoder(PoolId("pool"), NS, PS).decode(
        batch([sgl_stored([1], None, [0] * PS, medium="DISK")]))
    assert plain.ops[0].location.holder == "pool"  # type: ignore[union-attr]


def test_refusals_are_typed_counted_and_do_not_stop_the_batch() -> None:
    d = decoder()
    good = sgl_stored([1], None, [0] * PS)
    events = [
        sgl_stored([2], None, [0] * 8, block_size=8),  # page size mismatch
        sgl_stored(["x"], None, [0] * PS),  # bad hash
        sgl_stored([3], None, [0] * PS, medium="TAPE"),  # unknown medium
        {"type": "Nope"},
        42,
        sgl_stored([4, 5], None, [0] * PS, cache_salt="s"),  # too few tokens to re-key
        sgl_stored([6], 999, [0] * PS, cache_salt="s"),  # parent never stored
        good,
    ]
    out = d.decode(batch(events))
    assert [type(r) for r in out.refusals] == [
        PageSizeMismatchError, MalformedEventError, MalformedEventError, MalformedEventError,
        MalformedEventError, MalformedEventError, UnknownParentError,
    ]  # fmt: skip
    assert len(out.ops) == 1 and out.ops[0].keys == [1]  # type: ignore[union-attr]
    assert d.refused == {"page_size_mismatch": 1, "malformed": 5, "unknown_parent": 1}


@pytest.mark.parametrize("payload", [b"\xc1garbage", enc("str"), enc([1.0]), enc({"ts": 1}),
                                     enc(["ts", [], 0]), enc([1.0, [], -1])])  # fmt: skip
def test_malformed_batches(payload: bytes) -> None:
    d = decoder()
    out = d.decode(payload)
    assert out.ops == [] and d.refused == {"malformed": 1}
    assert out.unreadable, "the payload as a whole did not decode"


def test_a_batch_whose_events_are_all_refused_is_not_unreadable() -> None:
    """Only a payload that fails as a whole is ``unreadable``: a batch of one unknown-type
    event (a malformed refusal, no ops) was read, as was an empty batch."""
    for events in ([{"type": "Nope"}], [42], []):
        out = decoder().decode(batch(events))
        assert out.ops == [] and not out.unreadable, events
    assert decoder().decode(batch([sgl_stored([1], None, [0] * PS)])).unreadable is False


def test_vllm_extra_keys_and_other_groups_unsupported() -> None:
    d = decoder("vllm")
    ev = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
          "token_ids": [0] * PS, "block_size": PS, "lora_id": None, "medium": "GPU",
          "lora_name": None}  # fmt: skip
    out = d.decode(batch([dict(ev, extra_keys=[["mm-hash"]]), dict(ev, group_idx=1)]))
    assert [type(r) for r in out.refusals] == [UnsupportedEventError, UnsupportedEventError]


def test_refusal_logged_once_per_n(caplog: pytest.LogCaptureFixture) -> None:
    d = decoder(log_every=10)
    bad = batch([sgl_stored([1], None, [0] * 8, block_size=8)])
    with caplog.at_level(logging.WARNING, logger="radix_global.events"):
        for _ in range(25):
            d.decode(bad)
    assert d.refused["page_size_mismatch"] == 25
    assert len(caplog.records) == 3  # 1st, 10th, 20th


# ----------------------------------------------------------------------- real SGLang structs


@pytest.fixture(scope="module")
def sgl() -> Any:
    from sglang_patch import cpu_compat

    cpu_compat.apply()
    import sglang.srt.disaggregation.kv_events as kv_events
    import sglang.srt.mem_cache.radix_cache as radix_cache

    return kv_events, radix_cache


class _Alloc:
    device = "cpu"

    def free_segment(self, *args: Any, **kwargs: Any) -> None:
        pass


@pytest.mark.sglang
def test_real_sglang_cache_events_decode_to_router_keys(sgl: Any) -> None:
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams

    kv_events, radix_cache = sgl
    cache = radix_cache.RadixCache.create_simulated(
        mock_allocator=_Alloc(), page_size=PS, enable_kv_cache_events=True
    )
    cache.take_events()
    plain, salted = _tokens(16, seed=5), _tokens(12, seed=6)
    cache.insert(InsertParams(key=radix_cache.RadixKey(plain[:8]), value=torch.arange(8)))
    cache.insert(InsertParams(key=radix_cache.RadixKey(plain), value=torch.arange(16)))
    cache.insert(
        InsertParams(key=radix_cache.RadixKey(salted, cache_salt="t"), value=torch.arange(12))
    )
    payload = msgspec.msgpack.encode(kv_events.KVEventBatch(ts=2.0, events=cache.take_events()))
    d = decoder()
    stores = d.decode(payload).ops
    got = [k for op in stores for k in op.keys]  # type: ignore[union-attr]
    assert got == keys.page_keys(plain, PS) + keys.page_keys(salted, PS, cache_salt="t")
    assert d.rekeyed_entries == 3  # only the salted pages were re-keyed
    cache.evict(EvictParams(num_tokens=1000))
    payload = msgspec.msgpack.encode(kv_events.KVEventBatch(ts=3.0, events=cache.take_events()))
    removed = [k for op in d.decode(payload).ops for k in op.keys]  # type: ignore[union-attr]
    assert sorted(removed) == sorted(got)
    assert d.rekeyed_entries == 0 and not d.refused


# vLLM's wire shapes (vllm/distributed/kv_events.py, current main): tagged, omit_defaults structs
# in a map-encoded batch, optional fields omitted. Declared here field-for-field (vLLM is not
# installed) so the bytes are what msgspec produces for vLLM, not hand-built dicts.
class _VBase(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class BlockStored(_VBase):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(_VBase):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(_VBase):
    pass


class _VBatch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def test_vllm_msgspec_structs_round_trip() -> None:
    toks = _tokens(8, seed=9)
    h = [bytes([i]) * 32 for i in range(3)]
    d = decoder("vllm")
    stored = BlockStored(h[:2], None, toks, PS, None, "GPU", None, kv_cache_spec_kind="full")
    payload = enc(_VBatch(1.0, [stored, BlockRemoved([h[1]], "GPU"), AllBlocksCleared()], 3))
    out = d.decode(payload)
    want = keys.page_keys(toks, PS)
    loc = Location(W, 3, Tier.GPU)
    assert out.ops == [
        StorePages(NS, loc, None, want),
        RemovePages(NS, loc, [want[1]]),
        ClearHolder(W, None, 3),
    ]
    assert out.refusals == [] and d.rekeyed_entries == 0
