"""The embedded index's snapshot (``EmbeddedIndex``, ``docs/interfaces.md``,
"The router's index snapshot").

Pure bookkeeping on a real event loop: entries are put into the index directly, the workers'
event endpoints have no publisher (nothing arrives, so no event decides anything here; the feed
side is ``tests/radix_global/test_subscriber_resume.py``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.snapshot import (
    FeedPosition,
    FeedState,
    IndexSnapshot,
    encode_snapshot,
    write_snapshot,
)
from radix_global.subscriber import KVEventSubscriber
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId
from router.cluster.index_link import EmbeddedIndex
from router.cluster.registry import Source, WorkerEntry
from router.config import ConfigError, RouterConfig

pytestmark = pytest.mark.timeout(30)
NS, PS = Namespace("m@1"), 16
KEYS = [PageKey(i) for i in range(1, 9)]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def info(wid: str, port: int = 1, **kw: object) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, url=f"http://127.0.0.1:{port}", model="m", namespace=NS,
                      page_size=PS, kv_events_endpoint=f"tcp://127.0.0.1:{port}", **kw)  # type: ignore[arg-type]


def entry(i: WorkerInfo) -> WorkerEntry:
    return WorkerEntry(i, Source.REGISTERED, 0.0)


def held(link: EmbeddedIndex, holder: str) -> int:
    hm = link.index.match(NS, KEYS, link._clock()).matched.get((WorkerId(holder), 0))
    return 0 if hm is None else hm.pool  # pages at any tier


async def first_router(path: Path, *workers: WorkerInfo, clock: Clock) -> None:
    """Workers register, each holds KEYS; the router stops (writing its snapshot)."""
    link = EmbeddedIndex(snapshot_path=str(path), clock=clock)
    await link.start()
    for w in workers:
        link.worker_added(entry(w))
        link.index.apply(StorePages(NS, Location(WorkerId(w.worker_id), 0, Tier.GPU), None,
                                    KEYS))
        link.index.match(NS, KEYS, clock())  # a hit: hotness to carry over
    await asyncio.sleep(0.05)  # the subscriptions
    await link.stop()


@pytest.mark.asyncio
async def test_a_returning_worker_keeps_its_entries_a_changed_one_loses_them(tmp_path: Path
                                                                            ) -> None:
    path = tmp_path / "index.snap"
    a, b = info("wa", 5001), info("wb", 5002)
    await first_router(path, a, b, clock=Clock(1000.0))
    link = EmbeddedIndex(snapshot_path=str(path), clock=Clock(1010.0))
    await link.start()
    try:
        assert link.restore_outcome == "restored 2 workers"
        assert held(link, "wa") == 8 and held(link, "wb") == 8  # routable before any event
        link.worker_added(entry(a))
        link.worker_added(entry(info("wb", 5003)))  # another endpoint: another engine
        assert held(link, "wa") == 8 and held(link, "wb") == 0
        assert link.stats()["snapshot"]["restored_waiting"] == []
    finally:
        await link.stop()


@pytest.mark.asyncio
async def test_a_worker_that_does_not_come_back_loses_its_entries(tmp_path: Path) -> None:
    path = tmp_path / "index.snap"
    await first_router(path, info("wa", 5001), clock=Clock(1000.0))
    link = EmbeddedIndex(snapshot_path=str(path), restore_grace_s=0.2, clock=Clock(1000.0))
    await link.start()
    try:
        assert held(link, "wa") == 8
        await asyncio.sleep(0.3)
        assert held(link, "wa") == 0
    finally:
        await link.stop()


@pytest.mark.asyncio
async def test_a_second_restart_within_the_grace_keeps_who_is_not_back_yet(tmp_path: Path
                                                                          ) -> None:
    path = tmp_path / "index.snap"
    await first_router(path, info("wa", 5001), clock=Clock(1000.0))
    link = EmbeddedIndex(snapshot_path=str(path), clock=Clock(1000.0))
    await link.start()
    await link.stop()
    again = EmbeddedIndex(snapshot_path=str(path), clock=Clock(1000.0))
    assert again.restore_outcome == "restored 1 workers" and held(again, "wa") == 8


@pytest.mark.asyncio
async def test_hotness_ages_are_kept_across_clocks(tmp_path: Path) -> None:
    """A snapshot from before a reboot lies in the monotonic clock's future: its stamps are
    shifted, so a prefix hit just before the stop is still hot, and decays from then on."""
    path = tmp_path / "index.snap"
    await first_router(path, info("wa", 5001), clock=Clock(50_000.0))
    link = EmbeddedIndex(snapshot_path=str(path), clock=Clock(30.0))  # after a reboot
    hot = link.index.hot_prefixes(NS, 1, 30.0)
    later = link.index.hot_prefixes(NS, 1, 30.0 + 600)
    assert hot and later and later[0].hit_rate < hot[0].hit_rate


def test_a_snapshot_without_feed_positions_restores_no_worker(tmp_path: Path) -> None:
    """An older file (the service's, no ``feeds``) cannot continue any stream: the index comes
    back, but no worker's entries are trusted."""
    path = tmp_path / "index.snap"
    donor = EmbeddedIndex()
    donor.index.register_namespace(NS, PS)
    donor.index.apply(StorePages(NS, Location(WorkerId("wa"), 0, Tier.GPU), None, KEYS))
    donor.index.apply(StorePages(NS, Location(PoolId("shm-h"), 0, Tier.POOL), None, KEYS))
    write_snapshot(path, encode_snapshot(IndexSnapshot(0.0, donor.index.snapshot(),
                                                       [info("wa")])))
    link = EmbeddedIndex(snapshot_path=str(path), clock=Clock(0.0))
    assert link.restore_outcome == "restored 0 workers"
    assert held(link, "wa") == 0 and held(link, "shm-h") == 8  # the pool lives on
    write_snapshot(path, encode_snapshot(IndexSnapshot(
        0.0, donor.index.snapshot(), [info("wa")], {"wa": FeedState([FeedPosition(3, 7)] * 2)})))
    assert held(EmbeddedIndex(snapshot_path=str(path), clock=Clock(0.0)), "wa") == 0  # 2 != 1 rank


@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad_index"])
def test_a_bad_snapshot_starts_the_router_empty_and_says_so(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "index.snap"
    good = encode_snapshot(IndexSnapshot(0.0, EmbeddedIndex().index.snapshot(), []))
    path.write_bytes({"garbage": b"not a snapshot at all",
                      "truncated": good[:-3],
                      "bad_index": encode_snapshot(IndexSnapshot(0.0, {"version": 99}, []))}
                     [damage])
    link = EmbeddedIndex(snapshot_path=str(path))
    assert link.restore_outcome.startswith("unreadable: ")
    assert link.index.namespaces() == [] or not list(link.index.namespaces())
    assert link.stats()["snapshot"]["restore"] == link.restore_outcome


def test_a_missing_file_is_a_first_start(tmp_path: Path) -> None:
    assert EmbeddedIndex(snapshot_path=str(tmp_path / "none")).restore_outcome == "none"


def test_config_refuses_a_snapshot_for_the_index_service() -> None:
    with pytest.raises(ConfigError, match="index serve --snapshot"):
        RouterConfig.from_options(index_url="127.0.0.1:5", index_snapshot="/tmp/x")
    with pytest.raises(ConfigError, match=">= 0"):
        RouterConfig.from_options(index_snapshot_interval_s=-1)


@pytest.mark.asyncio
async def test_the_saved_feed_state_is_handed_to_the_returning_worker_only(tmp_path: Path
                                                                           ) -> None:
    path = tmp_path / "index.snap"
    await first_router(path, info("wa", 5001), info("wb", 5002), clock=Clock(0.0))
    link = EmbeddedIndex(snapshot_path=str(path), clock=Clock(0.0))
    await link.start()
    calls: dict[str, object] = {}

    async def add_worker(i: WorkerInfo, lora_extra_keys: object = None,
                         resume: object = None) -> bool:
        calls[i.worker_id] = resume
        return True

    link._subscriber.add_worker = add_worker
    try:
        link.worker_added(entry(info("wa", 5001)))
        link.worker_added(entry(info("wb", 5009)))  # changed record
        link.worker_added(entry(info("wc", 5003)))  # never known
        await asyncio.sleep(0.05)
        assert calls["wa"] == FeedState([FeedPosition(-1, 0)]) and calls["wb"] is None
        assert calls["wc"] is None
    finally:
        link._subscriber.add_worker = KVEventSubscriber.add_worker.__get__(link._subscriber)
        await link.stop()
