"""router/cluster/lost_hosts.py: the hosts whose Mooncake segment died with its worker, as the
router tells the pool backends (docs/interfaces.md, "Mooncake Store as the L3 pool": reads
around a lost host)."""

from __future__ import annotations

from radix_global.registration import WorkerInfo
from router.cluster.lost_hosts import LostHosts


def info(wid: str, pool: str | None) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, url=f"http://{wid}:1", model="m", namespace="m@1",
                      page_size=4, pool_id=pool)


A = info("wa", "mooncake-m-1@10.0.0.2:30000")
A2 = info("wa2", "mooncake-m-1@10.0.0.2:30001")  # a second engine on host a
B = info("wb", "mooncake-m-1@10.0.0.3:30000")


def test_a_dead_workers_segment_host_is_lost_for_a_while_or_until_it_rejoins() -> None:
    now = [0.0]
    lost = LostHosts(hold_s=60, clock=lambda: now[0])
    lost.left(A, [B])
    assert lost.hosts() == ["10.0.0.2"]
    now[0] = 61.0
    assert lost.hosts() == []
    lost.left(A, [B])
    lost.joined(info("wa", "mooncake-m-1@10.0.0.2:30000"))  # restarted: its segment is new
    assert lost.hosts() == []


def test_no_host_is_lost_while_another_segment_lives_there_or_without_a_segment() -> None:
    lost = LostHosts()
    lost.left(A, [A2, B])
    lost.left(info("wc", "shm-c-1"), [B])
    lost.left(info("wd", None), [])
    assert lost.hosts() == []
