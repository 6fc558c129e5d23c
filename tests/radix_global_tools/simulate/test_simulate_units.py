"""Unit tests of the simulator's pure parts: caches, FIFO instances, workload, config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from radix_global.ops import RemovePages, StorePages
from radix_global.types import Namespace, PageKey, WorkerId
from radix_global_tools.simulate.config import (
    CPU_CONFIG,
    DEFAULT_CONFIG,
    Calibration,
    SimConfigError,
    load_calibration,
    load_config,
)
from radix_global_tools.simulate.instances import (
    PageCache,
    PrefillInstance,
    Waiting,
    local_location,
)
from radix_global_tools.simulate.shared_tiers import SharedTiers
from radix_global_tools.simulate.workload import (
    COPY_STRIDE,
    TraceFormatError,
    full_page_keys,
    read_trace_lines,
    replicate,
    scale_load,
)

NS = Namespace("m@1")


def keys(*ids: int) -> list[PageKey]:
    return [PageKey(i) for i in ids]


def test_cache_store_reports_missing_tail_with_parent() -> None:
    cache = PageCache(NS, local_location(WorkerId("p0")), 10)
    ops = cache.insert(keys(1, 2, 3))
    assert ops == [StorePages(NS, cache.location, None, keys(1, 2, 3))]
    ops = cache.insert(keys(1, 2, 4, 5))
    assert ops == [StorePages(NS, cache.location, PageKey(2), keys(4, 5))]
    assert cache.prefix_pages(keys(1, 2, 4, 9)) == 3
    assert cache.insert(keys(1, 2)) == []


def test_lru_eviction_emits_removal_of_least_recent_leaves_first() -> None:
    cache = PageCache(NS, local_location(WorkerId("p0")), 4)
    cache.insert(keys(1, 2, 3))  # chain A
    cache.insert(keys(1, 7))  # shares root 1; 1 is now newest
    ops = cache.insert(keys(8, 9))  # needs 1 page more than the capacity (5 > 4)... two
    removals = [op for op in ops if isinstance(op, RemovePages)]
    # the oldest leaves go first: 3 then 2 (never the shared, recently used ancestor 1)
    assert removals == [RemovePages(NS, cache.location, keys(3, 2))]
    assert len(cache) == 4 and PageKey(1) in cache and cache.evicted_pages == 2


def test_touch_protects_a_prefix_from_eviction() -> None:
    cache = PageCache(NS, local_location(WorkerId("p0")), 3)
    cache.insert(keys(1, 2))
    cache.insert(keys(5))
    cache.touch(keys(1, 2))  # 5 is now the oldest
    ops = cache.insert(keys(6))
    assert ops[-1] == RemovePages(NS, cache.location, keys(5))


def _instance(max_batch: int = 1, overhead_s: float = 0.0) -> PrefillInstance[str]:
    return PrefillInstance(WorkerId("p0"), PageCache(NS, local_location(WorkerId("p0")), 4),
                           max_batch, overhead_s)


def test_fifo_instance_queue_times() -> None:
    inst = _instance()
    assert inst.enqueue(0.0, Waiting(2.0, 100, "a")) == 0.0  # idle: a start is due now
    batch, nxt = inst.start(0.0)
    assert (batch.start_s, batch.finish_s, nxt) == (0.0, 2.0, None)
    assert inst.enqueue(0.5, Waiting(1.0, 200, "b")) == 2.0  # waits behind the first
    assert inst.enqueue(0.6, Waiting(1.0, 50, "c")) is None  # a start is already due
    assert inst.waiting() == 2 and inst.waiting_tokens() == 250
    assert inst.free_at(0.7) == pytest.approx(4.0)
    batch, nxt = inst.start(2.0)
    assert [m.payload for m in batch.members] == ["b"] and (batch.finish_s, nxt) == (3.0, 3.0)
    assert inst.running(2.5) == 1 and inst.waiting() == 1
    batch, nxt = inst.start(3.0)
    assert (batch.finish_s, nxt) == (4.0, None) and inst.running(4.5) == 0
    assert inst.enqueue(5.0, Waiting(1.0, 300, "d")) == 5.0  # idle gap: starts at arrival
    assert inst.busy_s == pytest.approx(4.0) and inst.served == 3


def test_waiting_requests_start_as_one_batch_paying_the_overhead_once() -> None:
    inst = _instance(max_batch=2, overhead_s=0.1)
    inst.enqueue(0.0, Waiting(1.0, 100, "a"))
    inst.start(0.0)
    for name in "bcd":
        inst.enqueue(0.5, Waiting(0.5, 100, name))
    batch, nxt = inst.start(1.0)
    # b and c together: 0.5 + 0.5 - 0.1 of overhead paid once; d waits for the next batch
    assert [m.payload for m in batch.members] == ["b", "c"]
    assert batch.finish_s == pytest.approx(1.9) and nxt == pytest.approx(1.9)
    assert inst.running(1.5) == 2 and inst.waiting() == 1
    with pytest.raises(ValueError):
        _instance(max_batch=0)


def test_prefill_curve_matches_router_prior_features() -> None:
    cal = Calibration()
    c0, c1, c2, c3 = cal.prior_coefficients()
    n, p = 12_000, 4_000
    m, pk = (n - p) / 1000, p / 1000
    assert c0 + c1 * m + c2 * m * pk + c3 * m * m == pytest.approx(cal.prefill_s(n, p))
    assert cal.prefill_s(n, n) == pytest.approx(cal.fixed_s)
    assert cal.fetch_s(0) == 0.0
    assert cal.fetch_s(1000) == pytest.approx(cal.fetch_latency_s + 1000 * 327680 / 87e9)


def test_trace_reading_scaling_and_copies() -> None:
    lines = [
        '{"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}',
        "",
        '{"timestamp": 3000, "input_length": 600, "output_length": 2, "hash_ids": [0, 3]}',
    ]
    reqs = read_trace_lines(lines)
    assert [r.arrival_s for r in reqs] == [1.0, 3.0]
    assert full_page_keys(reqs[0], 512) == tuple(keys(0, 1))  # the partial third block is not keyed
    assert [r.arrival_s for r in scale_load(reqs, 2.0)] == [0.0, 1.0]
    both = replicate(reqs, 2)
    assert [r.request_id for r in both] == ["c0-r0", "c1-r0", "c0-r1", "c1-r1"]
    assert both[1].page_keys[0] == COPY_STRIDE + 0
    assert len(read_trace_lines(lines, limit=1)) == 1


def test_bad_trace_line_names_the_line() -> None:
    with pytest.raises(TraceFormatError, match="line 2"):
        read_trace_lines(
            ['{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}',
             '{"x": 1}']
        )


def test_committed_config_loads_and_bad_config_is_refused(tmp_path: Path) -> None:
    cfg = load_config()
    assert cfg.fig5_instances == 16 and cfg.calibration.kv_bytes_per_token == 327680
    assert min(cfg.fig5_loads) > 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nkv_bytes_per_token = 'many'\n")
    with pytest.raises(SimConfigError):
        load_config(bad)


def test_the_disk_table_is_optional_and_checked(tmp_path: Path) -> None:
    """A profile with [disk] plans a disk tier read at the slower of the disk and the fabric; one
    without plans none (and a disk asked of it is refused); a bad [disk] is one clear error."""
    assert load_config().calibration.disk_read_bytes_per_s == 26e9
    cal = load_calibration(CPU_CONFIG)
    assert cal.disk_read_bytes_per_s is None
    with pytest.raises(SimConfigError, match=r"\[disk\]"):
        SharedTiers(NS, cal, 1000, disk_tokens=1000)
    slow = replace(Calibration(), disk_read_bytes_per_s=1e9)
    assert slow.disk_fetch_Bps == 1e9 and slow.disk_fetch_s(1000) > slow.fetch_s(1000)
    text = DEFAULT_CONFIG.read_text()
    for bad, why in (("read_bytes_per_s = 0.0", "positive"), ("speed = 1.0", "read_bytes")):
        path = tmp_path / "bad.toml"
        path.write_text(text.replace("read_bytes_per_s = 26e9", bad))
        with pytest.raises(SimConfigError, match=why):
            load_config(path)
