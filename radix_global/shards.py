"""Partition the index across N shards by the first page key of each prompt's chain.

All pages of one prompt live on one shard, so a match is answered by exactly one shard and equals
what an unsharded index answers. The shard of a chain is ``head_key % N`` (page keys are already
uniform hashes). A store that continues a chain (``parent`` set) does not carry the chain head, so
the sharded index keeps a map ``page key -> shard`` of every key it routed; see
``docs/interfaces.md`` section "Shards" for the choice and its cost.

Shards are anything with the index's operation and query methods (:class:`IndexShard`): local
``GlobalIndex`` objects, or remote ``IndexClient`` objects of index services.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from radix_global.ops import (
    ClearHolder,
    HotPrefix,
    IndexOp,
    MalformedEventError,
    MatchResult,
    RemovePages,
    StorePages,
    UnknownNamespaceError,
    UnknownParentError,
)
from radix_global.types import HolderId, Namespace, PageKey


class IndexShard(Protocol):
    """What the sharded index needs of one shard (the ``GlobalIndex`` interface,
    ``docs/interfaces.md``, "Index operations")."""

    def register_namespace(self, namespace: Namespace, page_size: int) -> Any: ...
    def apply(self, op: IndexOp) -> Any: ...
    def remove_holder(self, holder: HolderId) -> Any: ...
    def match(self, namespace: Namespace, keys: Sequence[PageKey], now: float) -> MatchResult: ...
    def hot_prefixes(self, namespace: Namespace, top_k: int, now: float) -> list[HotPrefix]: ...
    def stats(self) -> Any: ...  # a NamedTuple (``IndexStats``) or a dict


class ShardedIndex:
    """N index shards behind the ``GlobalIndex`` interface; ops and matches routed by chain head.

    Refusals are those of the shards, plus ``UnknownParentError`` raised here (and counted in
    ``stats()["router_refused"]``) for a store whose parent was never routed to any shard.
    """

    def __init__(self, shards: Sequence[IndexShard]) -> None:
        if not shards:
            raise ValueError("a sharded index needs at least one shard")
        self.shards: list[IndexShard] = list(shards)
        self._key_shard: dict[Namespace, dict[PageKey, int]] = {}
        self._refused: Counter[str] = Counter()

    # ---- routing --------------------------------------------------------------------------
    def shard_of_chain(self, namespace: Namespace, head: PageKey) -> int:
        """The shard of the chain whose first page key (as seen so far) is ``head``."""
        known = self._key_shard.get(namespace, {}).get(head)
        return known if known is not None else head % len(self.shards)

    def _store_shard(self, op: StorePages) -> int:
        if op.parent is None:
            return self.shard_of_chain(op.namespace, op.keys[0])
        shard = self._key_shard.get(op.namespace, {}).get(op.parent)
        if shard is None:
            self._refused[UnknownParentError.reason] += 1
            raise UnknownParentError(f"parent page {op.parent} was never stored on any shard")
        return shard

    # ---- operations -----------------------------------------------------------------------
    def register_namespace(self, namespace: Namespace, page_size: int) -> None:
        for shard in self.shards:  # every shard holds every namespace: a refusal comes from #0
            shard.register_namespace(namespace, page_size)
        self._key_shard.setdefault(namespace, {})

    def apply(self, op: IndexOp) -> None:
        if isinstance(op, StorePages):
            if not op.keys:
                self.shards[0].apply(op)  # the shard validates the namespace
                return
            shard = self._store_shard(op)
            self.shards[shard].apply(op)
            owner = self._key_shard.setdefault(op.namespace, {})
            for key in op.keys:
                owner[key] = shard
        elif isinstance(op, RemovePages):
            by_shard: dict[int, list[PageKey]] = {}
            for key in op.keys:
                # An unknown key goes to its would-be shard, which counts and ignores it.
                by_shard.setdefault(self.shard_of_chain(op.namespace, key), []).append(key)
            if not by_shard:
                self.shards[0].apply(op)
            for shard, keys in by_shard.items():
                self.shards[shard].apply(op._replace(keys=keys))
        elif isinstance(op, ClearHolder):
            for shard_index in self.shards:
                shard_index.apply(op)
        else:
            raise TypeError(f"not an index operation: {op!r}")

    def remove_holder(self, holder: HolderId) -> None:
        for shard in self.shards:
            shard.remove_holder(holder)

    # ---- queries --------------------------------------------------------------------------
    def match(self, namespace: Namespace, keys: Sequence[PageKey], now: float) -> MatchResult:
        if namespace not in self._key_shard:
            raise UnknownNamespaceError(f"namespace {namespace!r} is not registered")
        shard = self.shard_of_chain(namespace, keys[0]) if keys else 0
        return self.shards[shard].match(namespace, keys, now)

    def hot_prefixes(self, namespace: Namespace, top_k: int, now: float) -> list[HotPrefix]:
        found = [p for s in self.shards for p in s.hot_prefixes(namespace, top_k, now)]
        return heapq.nlargest(top_k, found, key=lambda p: p.hit_rate)

    def stats(self) -> dict[str, Any]:
        per_shard = [stats_dict(s.stats()) for s in self.shards]
        total = _sum_numbers(per_shard)
        total["shards"] = len(self.shards)
        total["per_shard"] = per_shard
        total["router_refused"] = dict(self._refused)
        total["routed_keys"] = sum(len(m) for m in self._key_shard.values())
        return total

    # ---- persistence (local shards) -------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain data: every shard's ``snapshot()`` and the routing map (shards must be local)."""
        return {
            "sharded": True,
            "shards": [s.snapshot() for s in self.shards],  # type: ignore[attr-defined]
            "key_shard": {ns: list(m.items()) for ns, m in self._key_shard.items()},
        }

    @classmethod
    def restore(cls, data: dict[str, Any]) -> ShardedIndex:
        """Rebuild local ``GlobalIndex`` shards and the routing map from ``snapshot()`` data.
        Checked like ``GlobalIndex.restore``: a routing entry is an int64 key and the index of
        one of the shards (any other would fail every later op routed by it)."""
        from radix_global.index import GlobalIndex

        try:
            shards = [GlobalIndex.restore(state) for state in data["shards"]]
            # register_namespace goes to every shard: they must agree, or a query routed to
            # one of them would not find a namespace the others have.
            sizes = [{ns: s.page_size(ns) for ns in s.namespaces()} for s in shards]
            if any(size != sizes[0] for size in sizes):
                raise MalformedEventError("the shards of a snapshot disagree on the namespaces")
            index = cls(shards)
            n = len(index.shards)
            routes: dict[Namespace, dict[PageKey, int]] = {}
            for ns, pairs in data["key_shard"].items():
                if not isinstance(ns, str) or not isinstance(pairs, list):
                    raise MalformedEventError("a routing map is namespace -> [[key, shard]...]")
                table = routes[Namespace(ns)] = {}
                for k, shard in pairs:
                    if (type(k) is not int or not -(2**63) <= k < 2**63
                            or type(shard) is not int or not 0 <= shard < n):
                        raise MalformedEventError(f"bad routing entry for namespace {ns[:100]!r}")
                    table[PageKey(k)] = shard
            if set(routes) != set(sizes[0]):  # the map is also the sharded index's namespaces
                raise MalformedEventError("the routing map and the shards name other namespaces")
            index._key_shard = routes
        except MalformedEventError:
            raise
        except Exception as exc:  # RecursionError, wrong shapes...: still a bad snapshot
            raise MalformedEventError(f"bad sharded snapshot: {type(exc).__name__}: {exc}"[:300]
                                      ) from exc
        return index


def stats_dict(stats: Any) -> dict[str, Any]:
    return stats._asdict() if hasattr(stats, "_asdict") else dict(stats)


def _sum_numbers(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Field-wise sum of numbers (recursing into dicts) over the shards' stats."""
    out: dict[str, Any] = {}
    for d in dicts:
        for name, value in d.items():
            if isinstance(value, bool):
                continue
            if isinstance(value, int | float):
                out[name] = out.get(name, 0) + value
            elif isinstance(value, dict):
                out[name] = _sum_numbers([out.get(name, {}), value])
    return out
