"""Tell the index about L3 pool stores and removals (SGLang publishes no events for L3).

Wire format = SGLang's own KV-event stream (``docs/interfaces.md`` section 5), so the index decodes
it with the same decoder: ZMQ PUB, multipart ``(topic, seq: 8-byte big-endian, payload)``, payload a
msgpack ``KVEventBatch`` array ``[ts, events, dp_rank]``, events maps tagged by ``"type"``, with
``medium = "POOL"`` and ``block_hashes`` = our :data:`~radix_global.types.PageKey` (the signed int64
of the page digest's first 8 bytes). The holder is the pool id: the index subscribes to this
endpoint as the pool's stream (``pool_events_endpoint`` in the worker's registration).

Pure encoding (:func:`encode_pool_batch`) is separate from the socket (:class:`PoolEventPublisher`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from radix_global.types import PageKey

POOL_MEDIUM = "POOL"
_ENCODER = msgspec.msgpack.Encoder()


def block_stored(keys: Sequence[PageKey], parent: PageKey | None, page_size: int) -> dict[str, Any]:
    """A ``BlockStored`` event for pages now in the pool, following ``parent`` (None = root or
    unknown: the index accepts a re-store of known keys)."""
    return {
        "type": "BlockStored",
        "block_hashes": [int(k) for k in keys],
        "parent_block_hash": None if parent is None else int(parent),
        "token_ids": [],
        "block_size": page_size,
        "lora_id": None,
        "medium": POOL_MEDIUM,
        "cache_salt": None,
    }


def block_removed(keys: Sequence[PageKey]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [int(k) for k in keys], "medium": POOL_MEDIUM}


def encode_pool_batch(events: Sequence[dict[str, Any]], ts: float | None = None) -> bytes:
    """One ``KVEventBatch`` payload (array form, dp rank 0: the pool has no ranks)."""
    return _ENCODER.encode([time.time() if ts is None else ts, list(events), 0])


class PoolEventPublisher:
    """Binds a ZMQ PUB socket; thread-safe (SGLang's prefetch and backup threads both publish)."""

    def __init__(self, endpoint: str, topic: str = "kv-events") -> None:
        import zmq

        self._sock: Any = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self.endpoint = endpoint
        self._topic = topic.encode()
        self._seq = 0
        self._lock = threading.Lock()

    def publish(self, events: Sequence[dict[str, Any]]) -> int:
        """Send one batch; returns its sequence number (consecutive from 0). No-op if empty."""
        if not events:
            return -1
        payload = encode_pool_batch(events)
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._sock.send_multipart([self._topic, seq.to_bytes(8, "big", signed=True), payload])
        return seq

    def close(self) -> None:
        with self._lock:
            self._sock.close(0)
