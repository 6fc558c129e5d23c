"""Conversions between the index's typed values (``ops.py``) and the gRPC messages of
``radix_global/proto/index.proto``; shared by the service and its client so both sides agree by
construction.

Also the refusal vocabulary: the service puts an error's ``reason`` in the trailing metadata key
``rg-reason`` and the client turns it back into the same exception class.
"""

from __future__ import annotations

from itertools import pairwise

from radix_global.ops import (
    ClearHolder,
    HolderMatch,
    HotPrefix,
    IndexOp,
    IndexRefusal,
    MalformedEventError,
    MatchResult,
    PageSizeMismatchError,
    RemovePages,
    StorePages,
    StoreSpan,
    UnknownNamespaceError,
    UnknownParentError,
)
from radix_global.pool_ids import is_store_segment, store_of
from radix_global.proto import index_pb2 as pb
from radix_global.registration import RegistrationError
from radix_global.types import Location, Namespace, PageKey, Tier, WorkerId

REASON_KEY = "rg-reason"


class UnknownWorkerError(KeyError):
    """A worker id that is not registered (deregister, heartbeat)."""

    reason = "unknown_worker"

    def __str__(self) -> str:  # KeyError quotes its argument; a message reads better
        return str(self.args[0]) if self.args else "unknown worker"


class IdConflictError(RegistrationError):
    """A pool id equal to a registered worker id, or a worker id equal to a registered pool id."""

    reason = "id_conflict"


REFUSALS: dict[str, type[Exception]] = {
    "unknown_namespace": UnknownNamespaceError,
    "unknown_parent": UnknownParentError,
    "page_size_mismatch": PageSizeMismatchError,
    "malformed": MalformedEventError,
    "invalid": IndexRefusal,
    "unknown_worker": UnknownWorkerError,
    "bad_registration": RegistrationError,
    "id_conflict": IdConflictError,
}


def reason_of(exc: Exception) -> str:
    if isinstance(exc, RegistrationError) and not isinstance(exc, IdConflictError):
        return "bad_registration"
    return str(getattr(exc, "reason", "invalid"))


# ---- locations and ops ----------------------------------------------------------------------
def location_to_pb(loc: Location) -> pb.Location:
    return pb.Location(holder=loc.holder, dp_rank=loc.dp_rank, tier=int(loc.tier))


def location_from_pb(msg: pb.Location) -> Location:
    if not msg.holder:
        raise MalformedEventError("location without a holder")
    try:
        tier = Tier(msg.tier)
    except ValueError as exc:
        raise MalformedEventError(f"unknown tier {msg.tier}") from exc
    return Location(WorkerId(msg.holder), msg.dp_rank, tier)


def op_to_pb(op: IndexOp) -> pb.IndexOp:
    if isinstance(op, StorePages):
        store = pb.StorePages(
            namespace=op.namespace, location=location_to_pb(op.location), keys=op.keys
        )
        if op.parent is not None:
            store.parent = op.parent
        return pb.IndexOp(store=store)
    if isinstance(op, RemovePages):
        return pb.IndexOp(
            remove=pb.RemovePages(
                namespace=op.namespace, location=location_to_pb(op.location), keys=op.keys
            )
        )
    if isinstance(op, ClearHolder):
        clear = pb.ClearHolder(holder=op.holder, tier=int(op.tier or 0))
        if op.dp_rank is not None:
            clear.dp_rank = op.dp_rank
        return pb.IndexOp(clear=clear)
    raise TypeError(f"not an index operation: {op!r}")


def op_from_pb(msg: pb.IndexOp) -> IndexOp:
    kind = msg.WhichOneof("op")
    if kind == "store":
        s = msg.store
        parent = PageKey(s.parent) if s.HasField("parent") else None
        keys = [PageKey(k) for k in s.keys]
        return StorePages(Namespace(s.namespace), location_from_pb(s.location), parent, keys)
    if kind == "remove":
        r = msg.remove
        keys = [PageKey(k) for k in r.keys]
        return RemovePages(Namespace(r.namespace), location_from_pb(r.location), keys)
    if kind == "clear":
        c = msg.clear
        if not c.holder:
            raise MalformedEventError("ClearHolder without a holder")
        try:
            tier = Tier(c.tier) if c.tier else None
        except ValueError as exc:
            raise MalformedEventError(f"unknown tier {c.tier}") from exc
        return ClearHolder(WorkerId(c.holder), tier, c.dp_rank if c.HasField("dp_rank") else None)
    raise MalformedEventError("IndexOp with no operation set")


# ---- query results --------------------------------------------------------------------------
def match_to_pb(result: MatchResult) -> pb.MatchReply:
    return pb.MatchReply(
        query_pages=result.query_pages,
        matched=[
            pb.HolderMatch(holder=h, dp_rank=dp, gpu=m.gpu, host=m.host, pool=m.pool)
            for (h, dp), m in sorted(result.matched.items())
        ],
        best_pages=result.best_pages,
        best_holders=sorted(result.best_holders),
        store_runs=[
            pb.StoreRun(store=store, spans=[
                pb.StoreSpan(end_page=s.end_page, segments=sorted(s.segments)) for s in spans])
            for store, spans in sorted(result.store_runs.items())
        ],
    )


def match_from_pb(msg: pb.MatchReply) -> MatchResult:
    return MatchResult(
        query_pages=msg.query_pages,
        matched={
            (WorkerId(m.holder), m.dp_rank): HolderMatch(m.gpu, m.host, m.pool)
            for m in msg.matched
        },
        best_pages=msg.best_pages,
        best_holders=frozenset(WorkerId(h) for h in msg.best_holders),
        store_runs=_store_runs(msg),
    )


def _store_runs(msg: pb.MatchReply) -> dict[str, tuple[StoreSpan, ...]]:
    """The runs as sent, each checked: a store named twice has none (priced per segment, as
    without them)."""
    named = [run.store for run in msg.store_runs]
    return {run.store: spans for run in msg.store_runs
            if named.count(run.store) == 1 and (spans := _spans(run, msg.query_pages))}


def _spans(run: pb.StoreRun, query_pages: int) -> tuple[StoreSpan, ...]:
    """A store's spans as sent; none unless they end in increasing order within the query and
    each names segments of that store only: a reply that breaks that is not a run the router
    can plan a fetch on."""
    spans = tuple(StoreSpan(s.end_page, frozenset(WorkerId(h) for h in s.segments))
                  for s in run.spans)
    ends = [0, *(s.end_page for s in spans)]
    if any(b <= a for a, b in pairwise(ends)) or ends[-1] > query_pages or any(
            not s.segments or any(not is_store_segment(h) or store_of(h) != run.store
                                  for h in s.segments)
            for s in spans):
        return ()
    return spans


def hot_to_pb(prefixes: list[HotPrefix]) -> pb.HotPrefixesReply:
    return pb.HotPrefixesReply(
        prefixes=[
            pb.HotPrefix(keys=p.keys, pages=p.pages, hit_rate=p.hit_rate, holders=p.holders)
            for p in prefixes
        ]
    )


def hot_from_pb(msg: pb.HotPrefixesReply) -> list[HotPrefix]:
    return [
        HotPrefix(tuple(PageKey(k) for k in p.keys), p.pages, p.hit_rate, p.holders)
        for p in msg.prefixes
    ]
