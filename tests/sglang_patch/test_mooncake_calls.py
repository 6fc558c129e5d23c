"""plan_calls: a batch of pages cut into Mooncake calls (sglang_patch/pool/mooncake_calls.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_patch.pool.base import PageIO
from sglang_patch.pool.mooncake_calls import BATCH_BUFFERS, address_of, plan_calls

MEM = np.zeros(1 << 20, np.uint8)  # "registered": the first half only
REGIONS = [(address_of(memoryview(MEM)), address_of(memoryview(MEM)) + MEM.nbytes // 2)]


def pages_of(shapes: list[tuple[int, int, bool]]) -> list[PageIO]:
    """(chunks, chunk bytes, in registered memory) per page."""
    out, at = [], 0
    for i, (chunks, size, registered) in enumerate(shapes):
        if registered:
            base = at % (MEM.nbytes // 2 - chunks * size)
            out.append(PageIO(f"k{i}", [MEM[base + j * size:base + (j + 1) * size]
                                        for j in range(chunks)], i))
            at += chunks * size
        else:
            out.append(PageIO(f"k{i}", [np.zeros(size, np.uint8) for _ in range(chunks)], i))
    return out


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.sampled_from([8, 512]), st.booleans()),
                max_size=60),
       st.integers(1, 20))
def test_calls_are_bounded_homogeneous_and_in_order(shapes: list[tuple[int, int, bool]],
                                                    slots: int) -> None:
    page_bytes = 280 * 512  # pages above it are left out
    calls = plan_calls(pages_of(shapes), REGIONS, page_bytes, 512, slots)
    flat = [d for call in calls for d in call]
    fits = [i for i, (n, size, _) in enumerate(shapes) if n * size <= page_bytes]
    assert [d.at for d in flat] == fits  # every page that fits, once, in order
    for call in calls:
        assert call and len({d.direct for d in call}) == 1
        direct = call[0].direct
        transfers = sum(len(d.spans) + 1 if direct else 1 for d in call)
        assert transfers <= BATCH_BUFFERS
        assert direct or len(call) <= slots
    for d in flat:  # zero-copy exactly for registered pages of chunks >= 512 bytes that fit a call
        chunks, size, registered = shapes[d.at]
        assert d.direct == (registered and size >= 512 and chunks + 1 <= BATCH_BUFFERS)
