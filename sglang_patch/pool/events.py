"""Tell the index about L3 pool stores and removals (SGLang publishes no events for L3).

Wire format = SGLang's own KV-event stream (``docs/interfaces.md`` section "Events in"), so the
index decodes it with the same decoder: ZMQ PUB, multipart
``(topic, seq: 8-byte big-endian, payload)``, payload a msgpack ``KVEventBatch`` array
``[ts, events, dp_rank]``, events maps tagged by ``"type"``, with ``medium = "POOL"`` and
``block_hashes`` = our :data:`~radix_global.types.PageKey` (the signed int64 of the page digest's
first 8 bytes). The holder is the pool id: the index subscribes to this endpoint as the pool's
stream (``pool_events_endpoint`` in the worker's registration).

Pure encoding (:func:`encode_pool_batch`) is separate from the socket (:class:`PoolEventPublisher`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from radix_global.types import PageKey

log = logging.getLogger(__name__)
POOL_MEDIUM = "POOL"
# the pool's disk tier: its own holder (docs/interfaces.md,
# "The persistent disk tier under the pool")
DISK_MEDIUM = "DISK"
_ENCODER = msgspec.msgpack.Encoder()


def block_stored(keys: Sequence[PageKey], parent: PageKey | None, page_size: int,
                 medium: str = POOL_MEDIUM) -> dict[str, Any]:
    """A ``BlockStored`` event for pages now in the pool (``medium`` ``DISK``: in its disk
    tier), following ``parent`` (None = root or unknown: the index accepts a re-store of known
    keys)."""
    return {
        "type": "BlockStored",
        "block_hashes": [int(k) for k in keys],
        "parent_block_hash": None if parent is None else int(parent),
        "token_ids": [],
        "block_size": page_size,
        "lora_id": None,
        "medium": medium,
        "cache_salt": None,
    }


def run_stores(tags: Sequence[PageKey | None], parent_at: Callable[[int], PageKey | None],
               page_size: int) -> list[dict[str, Any]]:
    """``BlockStored`` events for a call's pages: ``tags[i]`` is page ``i``'s key, None where
    it is not to be published. One event per run of consecutive published pages, each after its
    own parent (``parent_at(i)``: the page before page ``i``), so a gap never makes a page the
    child of one it does not follow."""
    events: list[dict[str, Any]] = []
    start = -1
    for i, tag in enumerate([*tags, None]):
        if tag is not None and start < 0:
            start = i
        elif tag is None and start >= 0:
            run = [t for t in tags[start:i] if t is not None]
            events.append(block_stored(run, parent_at(start), page_size))
            start = -1
    return events


def block_removed(keys: Sequence[PageKey], medium: str = POOL_MEDIUM) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [int(k) for k in keys], "medium": medium}


def as_disk(event: dict[str, Any]) -> dict[str, Any]:
    """The same event about the pool's disk tier."""
    return {**event, "medium": DISK_MEDIUM}


def encode_pool_batch(events: Sequence[dict[str, Any]], ts: float | None = None) -> bytes:
    """One ``KVEventBatch`` payload (array form, dp rank 0: the pool has no ranks)."""
    return _ENCODER.encode([time.time() if ts is None else ts, list(events), 0])


class PoolEventPublisher:
    """Binds a ZMQ XPUB socket; thread-safe (SGLang's prefetch and backup threads both publish).
    ``on_subscribe`` runs (on a thread of the publisher's) whenever a subscriber joins: what it
    publishes reaches the newcomer, which a plain PUB would have lost."""

    def __init__(self, endpoint: str, topic: str = "kv-events",
                 on_subscribe: Callable[[], None] | None = None,
                 watch_interval_s: float = 0.2) -> None:
        import zmq

        self._zmq = zmq
        self._sock: Any = zmq.Context.instance().socket(zmq.XPUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every join, not only a topic's first
        self._sock.bind(endpoint)
        self.endpoint = endpoint
        self._topic = topic.encode()
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._on_subscribe = on_subscribe
        # Drains the join messages even without a callback: XPUB queues them for us to read.
        self._watch = threading.Thread(target=self._watch_loop, args=(watch_interval_s,),
                                       name="radix-global-pool-xpub", daemon=True)
        self._watch.start()

    def _joined(self) -> bool:
        """Drain the subscription messages; whether one was a join."""
        joined = False
        with self._lock:
            while self._sock.poll(0, self._zmq.POLLIN):
                msg = self._sock.recv(self._zmq.NOBLOCK)
                joined |= msg[:1] == b"\x01"
        return joined

    def _watch_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                if self._joined() and self._on_subscribe is not None:
                    self._on_subscribe()
            except Exception:  # a closed socket at shutdown, a failing announcement
                if not self._stop.is_set():
                    log.exception("radix-global: announcing to a new pool subscriber failed")

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
        self._stop.set()
        self._watch.join(timeout=5.0)
        with self._lock:
            self._sock.close(0)
