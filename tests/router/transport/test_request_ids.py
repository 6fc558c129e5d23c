"""Engine request ids: unguessable (96 random bits each), unique, drawn from the OS in blocks."""

from __future__ import annotations

import re

from router.transport.request_ids import RequestIds


def test_ids_are_96_random_bits_and_never_repeat_across_blocks() -> None:
    ids = RequestIds()
    got = [ids.new() for _ in range(3 * RequestIds.BLOCK // 12 + 5)]  # past three refills
    assert all(re.fullmatch(r"rg-[0-9a-f]{24}", rid) for rid in got)
    assert len(set(got)) == len(got)
    assert RequestIds().new() not in got  # another router's ids are not these
