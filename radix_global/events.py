"""Decode engine KV-event batches (SGLang, vLLM) into index operations. Pure: no I/O.

Contract (``docs/interfaces.md`` sections "Page keys" and "Events in"):

* A payload is a msgpack ``KVEventBatch``: an array ``[ts, events, dp_rank]`` or a map with ``ts``,
  ``events`` and ``attn_dp_rank`` / ``data_parallel_rank``. Each event is a tagged msgspec struct,
  either a map with a ``"type"`` key or an array whose first item is the tag. Array field order is
  engine-specific (SGLang's 7th ``BlockStored`` field is ``cache_salt``, vLLM's is ``lora_name``).
* ``medium`` -> tier: ``GPU`` (or absent) -> GPU; ``CPU``/``CPU_PINNED`` -> HOST;
  ``DISK``/``EXTERNAL``/``L3``/``POOL`` -> POOL. The batch's dp rank -> ``Location.dp_rank``.
* Plain SGLang stores (no ``cache_salt``, no ``lora_name``) carry page keys as block hashes: used
  as they are. An int block hash is 64 bits, signed (SGLang) or unsigned (vLLM publishes the low
  64 bits of SHA-256 as an unsigned int): an unsigned one is taken as its two's-complement int64.
  Every other store (SGLang salted/LoRA, vLLM) is re-keyed from its
  ``token_ids`` with :mod:`radix_global.keys`; the decoder remembers ``EngineHash -> (PageKey,
  digest)`` per (dp rank, tier) copy, to translate later parents and removals, and forgets an
  entry when no copy is left or on ``AllBlocksCleared``.
* A bad event is refused with a typed :class:`IndexRefusal` (counted by reason, logged on the 1st
  and every ``log_every``-th), never raised out of :meth:`EventDecoder.decode`; the other events
  of the batch still decode. That holds for ANY failure while decoding (a ``RecursionError`` from
  deep nesting, a bug), so a caller can always advance past the message; a payload that fails as
  a whole (before any event) is marked ``DecodedBatch.unreadable``. Refusal messages quote
  the offending value through a bounded repr: a hostile payload cannot flood the log.
* A store's ``token_ids`` are decoded only when a re-key reads them (they are nearly all of a
  batch's bytes): bytes there that are no msgpack value (an invalid UTF-8 string, a malformed
  ext) make that one event malformed where it is re-keyed, and a plain SGLang store, which
  never reads them, applies; any other malformed byte still makes the batch unreadable.
* A batch's dp rank must be below the worker's ``dp_size`` (when known) and fit a uint32 (the
  wire's ``dp_rank``): an out-of-range rank would land in the index and fail every later answer.
"""

from __future__ import annotations

import logging
import reprlib
from collections import Counter
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, NamedTuple

import msgspec

from radix_global import keys
from radix_global.ops import (
    ClearHolder,
    IndexOp,
    IndexRefusal,
    MalformedEventError,
    PageSizeMismatchError,
    RemovePages,
    StorePages,
    UnknownParentError,
)
from radix_global.types import EngineHash, HolderId, Location, Namespace, PageKey, Tier

log = logging.getLogger(__name__)


class EngineKind(StrEnum):
    """Which event encoding and hash rules a worker's events follow."""

    SGLANG = "sglang"  # default format: plain block hashes are page keys
    VLLM = "vllm"  # seeded hashes we cannot reproduce: always re-key
    # No "dynamo" event format: no worker can declare it (WorkerInfo.engine is sglang|vllm|other,
    # the launch wrapper writes SGLang's --kv-events-config itself, in the default format).


class UnknownLoraError(IndexRefusal):
    """A store names a LoRA adapter whose extra key the decoder was not given."""

    reason = "unknown_lora"


class UnsupportedEventError(IndexRefusal):
    """A well-formed event we deliberately do not index (e.g. vLLM extra keys, other KV groups)."""

    reason = "unsupported"


class DecodedBatch(NamedTuple):
    """One batch's ops and refused events. ``unreadable``: the payload as a whole could not be
    decoded (not msgpack, no batch shape, a bad ts or dp rank, any failure before its events):
    nothing of it is known, not even which events it held. A batch whose events were each
    refused (say, an unknown event type) is read, not unreadable."""

    ts: float
    dp_rank: int
    ops: list[IndexOp]
    refusals: list[IndexRefusal]
    unreadable: bool = False


_MEDIUM_TIER = {
    "GPU": Tier.GPU,
    "CPU": Tier.HOST,
    "CPU_PINNED": Tier.HOST,
    "DISK": Tier.POOL,
    "EXTERNAL": Tier.POOL,
    "L3": Tier.POOL,
    "POOL": Tier.POOL,
}
_STORED = {
    "sglang": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
               "medium", "cache_salt", "session_id", "lora_name"),
    "vllm": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
             "medium", "lora_name", "extra_keys", "group_idx"),
}  # fmt: skip
_REMOVED = {"sglang": ("block_hashes", "medium"), "vllm": ("block_hashes", "medium", "group_idx")}
_HASH_RANGE = (-(2**63), 2**64 - 1)  # int64 (SGLang) or uint64 (vLLM: low 64 bits of SHA-256)
MAX_DP_RANK = 2**32 - 1  # the gRPC messages carry dp_rank as uint32

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 3, 60, 60


def short(value: Any) -> str:
    """A bounded repr of untrusted data, for refusal messages (they are logged)."""
    try:
        return _repr.repr(value)
    except Exception:  # a repr that fails is no reason to fail the refusal
        return f"<unprintable {type(value).__name__}>"


class RekeyedPage(msgspec.Struct, frozen=True, array_like=True):
    """One entry of a decoder's re-keying map as a snapshot keeps it (``docs/interfaces.md``,
    "The router's index snapshot"): without it, a restored page's removal or child cannot be
    translated."""

    engine_hash: int | bytes
    key: int
    digest: bytes
    copies: list[tuple[int, int]]  # (dp rank, tier)


class _Rekeyed:
    """What an engine hash stands for in our key space, and which copies of it exist."""

    __slots__ = ("copies", "digest", "key")

    def __init__(self, key: PageKey, digest: bytes) -> None:
        self.key = key
        self.digest = digest
        self.copies: set[tuple[int, Tier]] = set()


_SPLIT_LIST = msgspec.msgpack.Decoder(list[msgspec.Raw])
_SPLIT_MAP = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
_TOKENS_AT = 3  # ``token_ids`` in a BlockStored array (after the tag), in both layouts
# SGLang's own shape, [ts, [[tag, field...], ...], dp rank], in one pass
_SPLIT_ARRAYS = msgspec.msgpack.Decoder(tuple[float, list[list[msgspec.Raw]], int | None])
_SPLIT_MAPS = msgspec.msgpack.Decoder(tuple[float, list[dict[str, msgspec.Raw]], int | None])


def _envelope(payload: bytes, decoder: msgspec.msgpack.Decoder[Any]) -> Any:
    """A batch decoded as ``decoder`` would decode it, except each BlockStored's ``token_ids``,
    left as ``msgspec.Raw``: a plain SGLang store never reads them, and they are nearly all of a
    batch's bytes (decoding them was 97 % of a 236-page batch's decode). A value of another shape
    than a batch's arrays and maps is decoded whole, as before."""
    try:
        ts, events, rank = _SPLIT_ARRAYS.decode(payload)
        return [ts, [_array_event(ev, decoder) for ev in events], rank]
    except msgspec.ValidationError:
        pass
    try:
        ts, maps, rank = _SPLIT_MAPS.decode(payload)
        return [ts, [_map_event(ev, decoder) for ev in maps], rank]
    except msgspec.ValidationError:  # a map batch, mixed events, a bad ts or rank: step by step
        pass
    split = _split(payload)
    if isinstance(split, list):
        if len(split) < 2:
            return [decoder.decode(x) for x in split]
        return [decoder.decode(split[0]), _events(split[1], decoder),
                *(decoder.decode(x) for x in split[2:])]
    if isinstance(split, dict):
        return {k: _events(v, decoder) if k == "events" else decoder.decode(v)
                for k, v in split.items()}
    return decoder.decode(payload)


def _events(raw: msgspec.Raw, decoder: msgspec.msgpack.Decoder[Any]) -> Any:
    split = _split(raw)
    if not isinstance(split, list):
        return decoder.decode(raw)
    return [_event_fields(ev, decoder) for ev in split]


def _event_fields(raw: msgspec.Raw, decoder: msgspec.msgpack.Decoder[Any]) -> Any:
    split = _split(raw)
    if isinstance(split, list):
        return _array_event(split, decoder)
    if isinstance(split, dict):
        return _map_event(split, decoder)
    return decoder.decode(raw)


def _map_event(fields: dict[str, msgspec.Raw], decoder: msgspec.msgpack.Decoder[Any]
               ) -> dict[str, Any]:
    out = {k: decoder.decode(v) for k, v in fields.items() if k != "token_ids"}
    if "token_ids" in fields:
        raw = fields["token_ids"]
        out["token_ids"] = raw if out.get("type") == "BlockStored" else decoder.decode(raw)
    return out


def _array_event(items: list[msgspec.Raw], decoder: msgspec.msgpack.Decoder[Any]) -> list[Any]:
    head = [decoder.decode(x) for x in items[:_TOKENS_AT]]
    lazy = bool(head) and head[0] == "BlockStored"
    return head + [x if lazy and i == _TOKENS_AT else decoder.decode(x)
                   for i, x in enumerate(items[_TOKENS_AT:], _TOKENS_AT)]


def _split(raw: bytes | msgspec.Raw) -> list[msgspec.Raw] | dict[str, msgspec.Raw] | None:
    """An array's or a string-keyed map's items, undecoded; None for any other value."""
    first = memoryview(raw)[:1].tobytes()
    if not first:
        return None
    b = first[0]
    try:
        if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
            return _SPLIT_LIST.decode(raw)
        if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
            return _SPLIT_MAP.decode(raw)
    except msgspec.ValidationError:  # e.g. a map with other keys than strings: decode it whole
        return None
    return None


def _fields(ev: Any, names: tuple[str, ...]) -> dict[str, Any]:
    if isinstance(ev, dict):
        return ev
    return dict(zip(names, ev[1:], strict=False))


def _engine_hash(value: Any) -> EngineHash | bytes:
    # vLLM may publish bytes hashes (ExternalBlockHash = bytes | int); keep them as opaque keys.
    if isinstance(value, bytes):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and (
            _HASH_RANGE[0] <= value <= _HASH_RANGE[1]):
        # vLLM's int hashes are unsigned 64-bit: the same 64 bits as a two's-complement int64
        return EngineHash(value - 2**64 if value >= 2**63 else value)
    raise MalformedEventError(f"block hash must be a 64-bit int or bytes, got {short(value)}")


def _hash_list(value: Any) -> list[EngineHash | bytes]:
    if not isinstance(value, list):
        raise MalformedEventError("block_hashes must be a list")
    return [_engine_hash(v) for v in value]


class EventDecoder:
    """Stateful decoder for ONE worker (or pool): payload bytes -> index operations.

    ``lora_extra_keys`` maps a published ``lora_name`` to the request extra key SGLang hashes
    (see :func:`radix_global.keys.lora_extra_key`); stores of other adapters are refused.
    ``dp_size``: the worker's data-parallel ranks; a batch of another rank is refused.
    """

    def __init__(
        self,
        holder: HolderId,
        namespace: Namespace,
        page_size: int,
        engine: EngineKind | str = EngineKind.SGLANG,
        *,
        lora_extra_keys: Mapping[str, str] | None = None,
        log_every: int = 1000,
        dp_size: int | None = None,
        disk_holder: HolderId | None = None,
    ) -> None:
        self.holder = holder
        self.disk_holder = disk_holder  # a pool stream's DISK events go to its disk tier
        self.namespace = namespace
        self.page_size = page_size
        self.engine = EngineKind(engine)
        self._layout = "vllm" if self.engine is EngineKind.VLLM else "sglang"
        self._lora_extra_keys = dict(lora_extra_keys or {})
        self._log_every = max(1, log_every)
        self._max_rank = MAX_DP_RANK if dp_size is None else min(MAX_DP_RANK, dp_size - 1)
        self._rekeyed: dict[EngineHash | bytes, _Rekeyed] = {}
        self._raw = msgspec.msgpack.Decoder()
        self.refused: Counter[str] = Counter()
        self.events_decoded = 0

    @property
    def rekeyed_entries(self) -> int:
        return len(self._rekeyed)

    def forget(self) -> None:
        """Drop the re-keying map (the holder's entries were dropped from the index: resync)."""
        self._rekeyed.clear()

    def rekeyed_pages(self) -> list[RekeyedPage]:
        return [RekeyedPage(h, e.key, e.digest, sorted((r, int(t)) for r, t in e.copies))
                for h, e in self._rekeyed.items()]

    def restore_rekeyed(self, pages: list[RekeyedPage]) -> None:
        """Take a snapshot's re-keying map; ``MalformedEventError`` for an entry that cannot be
        one (the map is then left empty)."""
        try:
            restored: dict[EngineHash | bytes, _Rekeyed] = {}
            for p in pages:
                if not -(2**63) <= p.key < 2**63:
                    raise ValueError(f"page key {p.key} is not an int64")
                entry = _Rekeyed(PageKey(p.key), p.digest)
                entry.copies = {(r, Tier(t)) for r, t in p.copies}
                restored[_engine_hash(p.engine_hash)] = entry
        except (ValueError, IndexRefusal) as exc:
            raise MalformedEventError(f"bad re-keying entry in a snapshot: {exc}") from exc
        self._rekeyed = restored

    def _forget_rank(self, dp_rank: int) -> None:
        """Drop that rank's copies from the re-keying map (other ranks keep theirs)."""
        for h in list(self._rekeyed):
            entry = self._rekeyed[h]
            entry.copies = {c for c in entry.copies if c[0] != dp_rank}
            if not entry.copies:
                del self._rekeyed[h]

    def refuse(self, exc: IndexRefusal) -> None:
        """Count a refusal and log it (1st and every ``log_every``-th); also for index refusals."""
        self.refused[exc.reason] += 1
        n = self.refused[exc.reason]
        if n == 1 or n % self._log_every == 0:
            log.warning("%s: refused event (%s, #%d): %s", self.holder, exc.reason, n, exc)

    def decode(self, payload: bytes) -> DecodedBatch:
        """Decode one batch. Never raises: a payload that is no batch yields no ops, one
        refusal and ``unreadable``; a bad event is one refusal, the others still decode."""
        try:
            ts, events, dp_rank = self._batch(payload)
        except Exception as exc:  # RecursionError (deep nesting) too: see the module docstring
            bad = exc if isinstance(exc, IndexRefusal) else _malformed(exc)
            self.refuse(bad)
            return DecodedBatch(0.0, 0, [], [bad], unreadable=True)
        ops: list[IndexOp] = []
        refusals: list[IndexRefusal] = []
        for ev in events:
            try:
                op = self._event(ev, dp_rank)
            except IndexRefusal as exc:
                self.refuse(exc)
                refusals.append(exc)
                continue
            except Exception as exc:  # any shape we did not foresee is still one refused event
                bad = _malformed(exc)
                self.refuse(bad)
                refusals.append(bad)
                continue
            self.events_decoded += 1
            if op is not None:
                ops.append(op)
        return DecodedBatch(ts, dp_rank, ops, refusals)

    def _batch(self, payload: bytes) -> tuple[float, list[Any], int]:
        try:
            raw = _envelope(payload, self._raw)
        except msgspec.DecodeError as exc:
            raise MalformedEventError(f"not msgpack: {exc}") from exc
        if isinstance(raw, list) and len(raw) >= 2:
            ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
        elif isinstance(raw, dict) and "events" in raw:
            ts, events = raw.get("ts", 0.0), raw["events"]
            rank = raw.get("attn_dp_rank", raw.get("data_parallel_rank"))
        else:
            raise MalformedEventError("batch is neither [ts, events, dp_rank] nor a map")
        if not isinstance(events, list) or not isinstance(ts, int | float) or isinstance(ts, bool):
            raise MalformedEventError("batch needs a numeric ts and a list of events")
        if rank is None:
            rank = 0
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= self._max_rank:
            raise MalformedEventError(f"bad dp rank {short(rank)} (max {self._max_rank})")
        return float(ts), events, rank

    def _event(self, ev: Any, dp_rank: int) -> IndexOp | None:
        if isinstance(ev, dict):
            tag = ev.get("type")
        elif isinstance(ev, list) and ev:
            tag = ev[0]
        else:
            raise MalformedEventError(
                f"event is neither a tagged map nor a tagged array: {short(ev)}"
            )
        if tag == "BlockStored":
            return self._stored(_fields(ev, _STORED[self._layout]), dp_rank)
        if tag == "BlockRemoved":
            return self._removed(_fields(ev, _REMOVED[self._layout]), dp_rank)
        if tag == "AllBlocksCleared":
            self._forget_rank(dp_rank)
            return ClearHolder(self.holder, None, dp_rank)
        raise MalformedEventError(f"unknown event type {short(tag)}")

    def _location(self, f: dict[str, Any], dp_rank: int) -> Location:
        medium = f.get("medium") or "GPU"
        tier = _MEDIUM_TIER.get(medium.upper()) if isinstance(medium, str) else None
        if tier is None:
            raise MalformedEventError(f"unknown medium {short(medium)}")
        if f.get("group_idx") not in (None, 0):
            raise UnsupportedEventError(
                f"KV cache group {short(f['group_idx'])} (only group 0 indexed)"
            )
        if self.disk_holder is not None and medium.upper() == "DISK":
            return Location(self.disk_holder, dp_rank, Tier.POOL)
        return Location(self.holder, dp_rank, tier)

    def _stored(self, f: dict[str, Any], dp_rank: int) -> StorePages | None:
        hashes = _hash_list(f.get("block_hashes"))
        block_size = f.get("block_size")
        if block_size != self.page_size:
            raise PageSizeMismatchError(
                f"block_size {short(block_size)} != namespace page size {self.page_size}"
            )
        loc = self._location(f, dp_rank)
        parent_raw = f.get("parent_block_hash")
        parent = None if parent_raw is None else _engine_hash(parent_raw)
        if not hashes:
            return None
        salt, lora = f.get("cache_salt") or None, f.get("lora_name") or None
        if self.engine is EngineKind.SGLANG and salt is None and lora is None:
            if isinstance(parent, bytes) or any(isinstance(h, bytes) for h in hashes):
                raise MalformedEventError("SGLang block hashes must be int64")
            plain = [PageKey(h) for h in hashes]  # type: ignore[arg-type]
            return StorePages(self.namespace, loc, parent, plain)  # type: ignore[arg-type]
        return self._rekey(f, hashes, parent, loc, salt, lora)

    def _rekey(
        self,
        f: dict[str, Any],
        hashes: list[EngineHash | bytes],
        parent: EngineHash | bytes | None,
        loc: Location,
        salt: str | None,
        lora: str | None,
    ) -> StorePages:
        if self.engine is EngineKind.VLLM and any(k is not None for k in f.get("extra_keys") or ()):
            raise UnsupportedEventError("vLLM blocks with extra keys (mm/LoRA/salt) not re-keyable")
        tokens = f.get("token_ids")
        if isinstance(tokens, msgspec.Raw):  # left undecoded by _envelope until needed here
            tokens = self._raw.decode(tokens)
        if not isinstance(tokens, list) or len(tokens) != len(hashes) * self.page_size:
            raise MalformedEventError(
                f"token_ids must hold {len(hashes)} x {self.page_size} tokens to re-key"
            )
        if tokens and not isinstance(tokens[0], int):
            raise UnsupportedEventError("token_ids are not plain ints (bigram/EAGLE pages)")
        extra_key = None
        if lora is not None:
            extra_key = self._lora_extra_keys.get(lora)
            if extra_key is None:
                raise UnknownLoraError(f"no extra key configured for LoRA {short(lora)}")
        parent_key: PageKey | None = None
        if parent is None:
            digests = keys.page_digests(
                tokens, self.page_size, cache_salt=salt, extra_key=extra_key
            )
        else:
            entry = self._rekeyed.get(parent)
            if entry is None:
                raise UnknownParentError(
                    f"parent {short(parent)} was never stored by {self.holder}"
                )
            parent_key = entry.key
            digests = keys.page_digests(tokens, self.page_size, prior=entry.digest)
        out: list[PageKey] = []
        copy = (loc.dp_rank, loc.tier)
        for h, d in zip(hashes, digests, strict=True):
            known = self._rekeyed.get(h)
            if known is None:
                known = self._rekeyed[h] = _Rekeyed(keys.page_key(d), d)
            known.copies.add(copy)
            out.append(known.key)
        return StorePages(self.namespace, loc, parent_key, out)

    def _removed(self, f: dict[str, Any], dp_rank: int) -> RemovePages | None:
        hashes = _hash_list(f.get("block_hashes"))
        loc = self._location(f, dp_rank)
        copy = (loc.dp_rank, loc.tier)
        out: list[PageKey] = []
        for h in hashes:
            entry = self._rekeyed.get(h)
            if entry is not None:
                out.append(entry.key)
                entry.copies.discard(copy)
                if not entry.copies:
                    del self._rekeyed[h]
            elif self.engine is EngineKind.SGLANG and not isinstance(h, bytes):
                out.append(PageKey(h))
            # else: a re-keyed engine's hash we never saw stored; the index never had it either.
        return RemovePages(self.namespace, loc, out) if out else None


def _malformed(exc: BaseException) -> MalformedEventError:
    text = str(exc)
    cut = "..." if len(text) > 200 else ""
    return MalformedEventError(f"{type(exc).__name__}: {text[:200]}{cut}")
