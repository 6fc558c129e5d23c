"""Pool ids of stores shared by hosts (radix_global/pool_ids.py)."""

from __future__ import annotations

import pytest

from radix_global.pool_ids import is_segment, segment_host, segment_pool_id, store_of


def test_segments_of_a_store() -> None:
    seg = segment_pool_id("mooncake-m-50051", "10.77.0.2")
    assert seg == "mooncake-m-50051@10.77.0.2" and is_segment(seg)
    assert store_of(seg) == "mooncake-m-50051" == store_of("mooncake-m-50051")
    assert not is_segment("shm-host") and store_of("shm-host") == "shm-host"
    for store, segment in (("a@b", "c"), ("", "c"), ("a", "")):
        with pytest.raises(ValueError, match="non-empty"):
            segment_pool_id(store, segment)


def test_the_host_of_a_segment() -> None:
    assert segment_host("mooncake-m-50051@10.77.0.2:30000") == "10.77.0.2"
    assert segment_host("mooncake-m-50051@hostname") == "hostname"
    assert segment_host("shm-host") is None
