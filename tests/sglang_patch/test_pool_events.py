

def test_run_stores_publishes_each_run_of_pages_after_its_own_parent():
    from radix_global.types import PageKey
    from sglang_patch.pool.events import run_stores

    tags = [PageKey(10), PageKey(11), None, PageKey(13), None, None, PageKey(16)]
    events = run_stores(tags, lambda i: PageKey(100 + i), 4)
    assert [(e["block_hashes"], e["parent_block_hash"]) for e in events] == [
        ([10, 11], 100), ([13], 103), ([16], 106)]
    assert run_stores([None, None], lambda i: None, 4) == []
