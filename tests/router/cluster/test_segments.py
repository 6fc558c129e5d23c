"""A Mooncake segment pool id belongs to one worker (docs/interfaces.md,
"Mooncake Store as the L3 pool"; issue 35 item 10).

Two registrations naming one segment used to be accepted, and when the second worker left, the
index dropped the segment's entries with it: the first worker's pool prefix went from 4,096
tokens to 0. A segment is one worker's client's memory and leaves the index with that worker,
so the registry refuses the second (409); a pool id without ``@`` (an shm pool, a whole store
as one holder) is shared by design and stays accepted.
"""

from __future__ import annotations

import asyncio

import pytest

from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo, encode_worker_info
from radix_global.snapshot import (
    FeedPosition,
    FeedState,
    IndexSnapshot,
    encode_snapshot,
    write_snapshot,
)
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier
from router.cluster.index_link import EmbeddedIndex
from router.cluster.registry import ConflictError, Source, WorkerEntry, WorkerRegistry

NS, PS = Namespace("tiny@1"), 16
KEYS = [PageKey(i) for i in range(1, 257)]  # 256 pages of 16: 4,096 tokens
SEGMENT = "mooncake-m-50051@10.0.0.1:30000"


def info(wid: str, pool_id: str | None = SEGMENT, port: int = 1) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, url=f"http://127.0.0.1:{port}", model="tiny", namespace=NS,
                      page_size=PS, pool_id=pool_id)


def pool_tokens(index: EmbeddedIndex, pool: str = SEGMENT) -> int:
    hm = index.index.match(NS, KEYS, 0.0).matched.get((PoolId(pool), 0))
    return 0 if hm is None else hm.pool * PS


def test_the_registry_refuses_a_second_holder_of_a_segment_only():
    reg = WorkerRegistry()
    reg.add(info("w1"), Source.REGISTERED, 0.0)
    with pytest.raises(ConflictError, match="segment"):
        reg.add(info("w2", port=2), Source.REGISTERED, 0.0)
    assert [e.info.worker_id for e in reg.all()] == ["w1"]
    reg.add(info("w1"), Source.REGISTERED, 1.0)  # the same worker again: no conflict
    reg.add(info("w1", port=3), Source.REGISTERED, 2.0)  # its own new record: replaced
    for wid in ("s1", "s2"):  # an shm pool: many workers, one holder, by design
        reg.add(info(wid, pool_id="shm-host", port=4), Source.REGISTERED, 0.0)
    reg.remove("w1")
    reg.add(info("w2", port=2), Source.REGISTERED, 3.0)  # the segment is free again


def test_a_worker_refused_by_the_index_is_not_left_in_the_registry():
    def refuse(entry: WorkerEntry) -> None:
        raise ConflictError("index namespace has another page size")

    reg = WorkerRegistry(on_added=refuse)
    with pytest.raises(ConflictError):
        reg.add(info("w1"), Source.REGISTERED, 0.0)
    assert len(reg) == 0 and reg.page_size(NS) is None


def test_a_duplicate_segment_registration_is_a_409_and_keeps_the_first_workers_entries(
        router_factory):
    router = router_factory(workers=(), heartbeat_timeout_s=600)
    with router.client() as c:
        assert c.post("/admin/workers", content=encode_worker_info(info("w1"))).status_code == 201
        router.state.index.index.apply(
            StorePages(NS, Location(PoolId(SEGMENT), 0, Tier.POOL), None, KEYS))
        assert pool_tokens(router.state.index) == 4096
        r = c.post("/admin/workers", content=encode_worker_info(info("w2", port=2)))
        assert r.status_code == 409, r.text
        assert "segment" in r.json()["error"]["message"]
        assert pool_tokens(router.state.index) == 4096
        assert [w["worker_id"] for w in c.get("/admin/workers").json()["workers"]] == ["w1"]
        assert c.delete("/admin/workers/w1").status_code == 200
        assert pool_tokens(router.state.index) == 0  # its own worker's leaving drops it


@pytest.mark.asyncio
async def test_the_index_keeps_a_segment_another_followed_worker_names():
    """The guard behind the registry's refusal: the entries stay with the holder still there."""
    link = EmbeddedIndex()
    a, b = WorkerEntry(info("wa"), Source.REGISTERED), WorkerEntry(info("wb", port=2),
                                                                   Source.REGISTERED)
    link.worker_added(a)
    link.worker_added(b)
    link.index.apply(StorePages(NS, Location(PoolId(SEGMENT), 0, Tier.POOL), None, KEYS))
    link.worker_removed(b)
    assert pool_tokens(link) == 4096
    link.worker_removed(a)
    assert pool_tokens(link) == 0
    await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_new_worker_on_a_restored_workers_segment_drops_the_restored_entries(tmp_path):
    """A restored worker that does not come back would, at the end of its grace period, drop the
    segment a new worker registered meanwhile, with the new worker's entries: its entries go when
    the new worker registers the segment instead (a new process starts with an empty one)."""
    path = tmp_path / "index.snap"
    donor = EmbeddedIndex()
    donor.index.register_namespace(NS, PS)
    donor.index.apply(StorePages(NS, Location(PoolId(SEGMENT), 0, Tier.POOL), None, KEYS))
    write_snapshot(path, encode_snapshot(IndexSnapshot(
        0.0, donor.index.snapshot(), [info("old")], {"old": FeedState([FeedPosition(1, 1)])})))
    link = EmbeddedIndex(snapshot_path=str(path), clock=lambda: 0.0, restore_grace_s=600)
    assert link.restore_outcome == "restored 1 workers" and pool_tokens(link) == 4096
    link.worker_added(WorkerEntry(info("new", port=2), Source.REGISTERED))
    assert pool_tokens(link) == 0 and link.stats()["snapshot"]["restored_waiting"] == []
    link.index.apply(StorePages(NS, Location(PoolId(SEGMENT), 0, Tier.POOL), None, KEYS[:4]))
    link._expire_restored()  # the grace period ends: nothing of the new worker's goes
    assert pool_tokens(link) == 4 * PS
