"""What routers share through the coordination service: key names and records
(``docs/interfaces.md``, "Several routers, one view"). Pure: no I/O.

Every value is msgspec JSON carrying a schema version, read with a size bound; a value that does
not decode, is oversized, has another schema version or names another key than the one it was
read from is refused with :class:`RecordError` (the caller counts and logs it, and keeps what it
had).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import NamedTuple, TypeVar

import msgspec

from radix_global.registration import RegistrationError, WorkerInfo, decode_worker_info
from radix_global.types import PageKey, WorkerId
from router.routing.link_fit import LinkStats
from router.routing.load_view import SlotLoad
from router.routing.queue_model import Slot
from router.routing.topology import LinkKey, link_key

SCHEMA = 1
MAX_RECORD_BYTES = 1 << 20  # a shared prefix of 65,536 token ids as JSON; everything else is less
MAX_LOAD_SLOTS = 1 << 16  # slots one router may report load for
MAX_ROUTED_TIPS = 256  # routed prompts' tips in one load record (the oldest dropped beyond)
INT64 = (-(1 << 63), (1 << 63) - 1)  # a page key's range
PROFILE_COEFS = 4  # router/routing/prefill_model.py's prior
MAX_LINKS = 4096  # measured links and memory paths in one router's record
MAX_NODE_NAME = 200
MAX_LINK_SUM = 1e40  # past any link's sums (bytes² of a TB a load, decayed over ~46 loads)


class RecordError(ValueError):
    """A record in the service the router refuses (malformed, oversized, another schema or key)."""


class Kind(StrEnum):
    """The kinds of record, each under ``rg:<cluster>:<kind>:``."""

    WORKER = "worker"
    ROUTER = "router"
    LOAD = "load"
    DRAIN = "drain"
    PREFIX = "prefix"
    ALIAS = "alias"
    PROFILE = "profile"
    LEASE = "lease"
    LINK = "link"


class Notice(NamedTuple):
    """One message on the changes channel: ``<writer> <kind>:<id>``, and for a load record the
    record itself after a newline (``inline``; empty: the reader reads the key). Only a load
    notice is split at a newline: any other id is taken whole, whatever it contains."""

    writer: str
    kind: Kind
    ident: str
    inline: str = ""

    def encode(self) -> bytes:
        head = f"{self.writer} {self.kind}:{self.ident}"
        return (head + "\n" + self.inline if self.inline else head).encode()


def parse_notice(data: bytes | str) -> Notice:
    """A message from the changes channel; :class:`RecordError` when it names no kind we know
    or no id."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    writer, _, name = text.partition(" ")
    kind_text, _, ident = name.partition(":")
    try:
        kind = Kind(kind_text)
    except ValueError:
        raise RecordError(f"a notice names an unknown kind {kind_text[:40]!r}") from None
    inline = ""
    if kind is Kind.LOAD:
        ident, _, inline = ident.partition("\n")
    if not writer or not ident:
        raise RecordError(f"a notice names no writer or no id: {text[:120]!r}")
    return Notice(writer, kind, ident, inline)


class Keys:
    """Key names of one cluster. Names are ``rg:<cluster>:<kind>:<id>``; an id may contain ``:``
    (an alias is ``<namespace>:<head>``), the cluster name may not."""

    def __init__(self, cluster: str) -> None:
        if not cluster or ":" in cluster or len(cluster) > 64 or not cluster.isprintable():
            raise ValueError(f"cluster name must be 1-64 printable characters without ':', "
                             f"got {cluster!r}")
        self.prefix = f"rg:{cluster}:"
        self.changes = f"{self.prefix}changes"

    def key(self, kind: Kind, ident: str) -> str:
        return f"{self.prefix}{kind}:{ident}"

    def index(self, kind: Kind) -> str:
        """The set listing the ids of ``kind`` (a resync reads it, never the keyspace)."""
        return f"{self.prefix}ids:{kind}"


class WorkerRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A worker as the router that admitted it knows it: its registration (``WorkerInfo`` JSON,
    checked again by every reader) and what that router learned of its engine."""

    v: int
    registration: str
    model_path: str | None = None
    context_length: int | None = None
    lora: dict[str, str] = {}


class RouterRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A router that shares the view; routers of another version or config refuse to share."""

    v: int
    router_id: str
    version: str
    config_digest: str
    url: str | None = None


class SlotLoadRecord(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One slot's in-flight work routed by one router (``load_view.SlotLoad`` without the age)."""

    worker_id: str
    dp_rank: int
    requests: int
    prefilling: int
    prefill_tokens: int
    decode_tokens: int
    held: int


class RoutedTipRecord(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A prompt one router routed: its slot and its last page key (which stands for the whole
    prefix: page keys are chained)."""

    worker_id: str
    dp_rank: int
    tip: int


class LoadRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One router's in-flight work on every slot where it has some, and the prompts it routed
    since its previous publication; ``seq`` grows with each publication, so a reader knows a
    changed record from a refreshed one."""

    v: int
    router_id: str
    seq: int
    slots: list[SlotLoadRecord]
    routed: list[RoutedTipRecord] = msgspec.field(default_factory=list)


class DrainRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    v: int
    worker_id: str


class PrefixRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A shared platform prefix as registered (``PrefixSpec.to_json``, parsed again by readers)."""

    v: int
    name: str
    spec: dict[str, object]


class AliasItem(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    name: str
    salt: str
    page_size: int
    tokens: list[int]


class AliasRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The recorded entries of one salted chain head (``router/keying/alias_book.py``)."""

    v: int
    entries: list[AliasItem]


class ProfileRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A worker's fitted prefill profile (``router/cluster/profile_store.py``): the prefill
    model's four finite coefficients."""

    v: int
    worker_id: str
    namespace: str
    coef: list[float]

    def __post_init__(self) -> None:
        if len(self.coef) != PROFILE_COEFS or not all(map(math.isfinite, self.coef)):
            raise ValueError(f"coef must be {PROFILE_COEFS} finite numbers")


class LinkStatsRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One measured link's fit sums (``router/routing/link_fit.py::LinkStats``); ``a`` == ``b``:
    that host's memory path."""

    a: str
    b: str
    samples: int
    w: float
    x: float
    y: float
    xx: float
    xy: float


class LinkRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one router measured on the cluster's links (docs/interfaces.md, "Where hosts
    are": several routers)."""

    v: int
    router_id: str
    links: list[LinkStatsRecord]


R = TypeVar("R", bound=msgspec.Struct)


def link_record(router_id: str, links: Mapping[LinkKey, LinkStats]) -> LinkRecord:
    return LinkRecord(SCHEMA, router_id, [LinkStatsRecord(a, b, *stats)
                                          for (a, b), stats in sorted(links.items())])


def link_stats(record: LinkRecord) -> dict[LinkKey, LinkStats]:
    """A peer's measured links; :class:`RecordError` for a long node name, or sums no fit
    keeps: no sample, a weight under the newest sample's 1, no bytes or seconds, a number
    negative, not finite or past :data:`MAX_LINK_SUM`."""
    out: dict[LinkKey, LinkStats] = {}
    for e in record.links:
        sums = (e.w, e.x, e.y, e.xx, e.xy)
        if (max(len(e.a), len(e.b)) > MAX_NODE_NAME or e.samples < 1 or e.w < 1
                or e.x <= 0 or e.y <= 0
                or not all(math.isfinite(n) and 0 <= n <= MAX_LINK_SUM for n in sums)):
            raise RecordError(f"LinkRecord of {record.router_id[:120]!r}: bad link "
                              f"{e.a[:120]!r}-{e.b[:120]!r}")
        out[link_key(e.a, e.b)] = LinkStats(e.samples, *sums)
    return out


def load_record(router_id: str, seq: int, loads: Mapping[Slot, SlotLoad],
                routed: Sequence[tuple[Slot, PageKey]] = ()) -> LoadRecord:
    return LoadRecord(SCHEMA, router_id, seq, [
        SlotLoadRecord(str(w), r, x.requests, x.prefilling, x.prefill_tokens, x.decode_tokens,
                       x.held) for (w, r), x in sorted(loads.items())],
        [RoutedTipRecord(str(w), r, tip) for (w, r), tip in routed[-MAX_ROUTED_TIPS:]])


def load_tips(record: LoadRecord) -> list[tuple[Slot, PageKey]]:
    """A peer's routed prompts' (slot, last page key); :class:`RecordError` for a negative
    rank or a key out of the int64 range."""
    out: list[tuple[Slot, PageKey]] = []
    for t in record.routed:
        if t.dp_rank < 0 or not INT64[0] <= t.tip <= INT64[1]:
            raise RecordError(f"LoadRecord of {record.router_id!r}: bad routed tip on "
                              f"{t.worker_id[:120]!r}")
        out.append(((WorkerId(t.worker_id), t.dp_rank), PageKey(t.tip)))
    return out


def load_slots(record: LoadRecord) -> dict[Slot, SlotLoad]:
    """A peer's publication per slot; negative numbers are refused (:class:`RecordError`)."""
    out: dict[Slot, SlotLoad] = {}
    for s in record.slots:
        values = (s.requests, s.prefilling, s.prefill_tokens, s.decode_tokens, s.held)
        if min(values) < 0 or s.dp_rank < 0:
            raise RecordError(f"LoadRecord of {record.router_id!r}: negative load on "
                              f"{s.worker_id[:120]!r}")
        out[(WorkerId(s.worker_id), s.dp_rank)] = SlotLoad(*values)
    return out


def encode(record: msgspec.Struct) -> bytes:
    return msgspec.json.encode(record)


def decode(raw: bytes | str | None, kind: type[R], ident: str | None = None,
           max_bytes: int = MAX_RECORD_BYTES) -> R:
    """``raw`` as a ``kind`` record; :class:`RecordError` for anything the router must refuse.
    ``ident``: the id the key named, which the record's own id field must equal."""
    if raw is None:
        raise RecordError(f"{kind.__name__}: no value")
    if len(raw) > max_bytes:
        raise RecordError(f"{kind.__name__}: {len(raw)} bytes, over {max_bytes}")
    try:
        record = msgspec.json.decode(raw, type=kind)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise RecordError(f"{kind.__name__}: {str(exc)[:200]}") from None
    if getattr(record, "v", None) != SCHEMA:
        raise RecordError(f"{kind.__name__}: schema {getattr(record, 'v', None)}, "
                          f"this router reads {SCHEMA}")
    own = next((getattr(record, f) for f in ("worker_id", "router_id", "name")
                if hasattr(record, f)), None)
    if ident is not None and own is not None and own != ident:
        raise RecordError(f"{kind.__name__}: key names {ident[:120]!r}, record {str(own)[:120]!r}")
    if isinstance(record, LinkRecord) and len(record.links) > MAX_LINKS:
        raise RecordError(f"LinkRecord: {len(record.links)} links, over {MAX_LINKS}")
    if isinstance(record, LoadRecord) and (len(record.slots) > MAX_LOAD_SLOTS
                                           or len(record.routed) > MAX_ROUTED_TIPS):
        raise RecordError(f"LoadRecord: {len(record.slots)} slots, {len(record.routed)} routed "
                          f"tips, over {MAX_LOAD_SLOTS} or {MAX_ROUTED_TIPS}")
    return record


def worker_info(record: WorkerRecord, ident: str) -> WorkerInfo:
    """The registration inside ``record``, checked as a registration is."""
    try:
        info = decode_worker_info(record.registration)
    except RegistrationError as exc:
        raise RecordError(f"WorkerRecord {ident[:120]!r}: {exc}") from None
    if info.worker_id != ident:
        raise RecordError(f"WorkerRecord: key names {ident[:120]!r}, registration "
                          f"{info.worker_id[:120]!r}")
    return info
