"""vLLM 0.32 publishes int block hashes as UNSIGNED 64-bit values (low 64 bits of SHA-256), seen
on a real vLLM CPU server (tests/router/test_router_vllm_e2e.py): half of them are >= 2**63. The
decoder takes them as their two's-complement int64 instead of refusing them as malformed."""

from __future__ import annotations

import random

import msgspec

from radix_global import keys
from radix_global.events import EventDecoder
from radix_global.ops import RemovePages, StorePages
from radix_global.types import Namespace, PageKey, WorkerId

NS = Namespace("tiny@1")
PS = 128
BIG = [12183645873920489520, 14160549901134471268]  # hashes a real vLLM published (>= 2**63)


def _batch(*events: dict[str, object]) -> bytes:
    return msgspec.msgpack.encode([1795970611.3, list(events), 0])


def _stored(hashes: list[int], parent: int | None, tokens: list[int]) -> dict[str, object]:
    # the field set vLLM 0.32 publishes (map form, tagged "type")
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": PS, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [None] * len(hashes), "group_idx": 0}


def test_unsigned_vllm_hashes_are_rekeyed_chained_and_removed() -> None:
    rng = random.Random(0)
    tokens = [rng.randrange(200, 8192) for _ in range(3 * PS)]
    d = EventDecoder(WorkerId("w0"), NS, PS, "vllm")
    first = d.decode(_batch(_stored(BIG, None, tokens[: 2 * PS])))
    second = d.decode(_batch(_stored([2**64 - 1], BIG[1], tokens[2 * PS:])))
    gone = d.decode(_batch({"type": "BlockRemoved", "block_hashes": [2**64 - 1, BIG[0]],
                            "medium": "GPU", "group_idx": 0}))
    assert not (first.refusals or second.refusals or gone.refusals)
    expected = [PageKey(k) for k in keys.page_keys(tokens, PS)]
    (s1,), (s2,), (rm,) = first.ops, second.ops, gone.ops
    assert isinstance(s1, StorePages) and isinstance(s2, StorePages)
    assert s1.parent is None and s1.keys == expected[:2]
    assert s2.parent == expected[1] and s2.keys == expected[2:]
    assert isinstance(rm, RemovePages) and rm.keys == [expected[2], expected[0]]

