"""Fuzz the shm pool's shared files (issue 12, "keep them closed": pool metadata).

Each example stores pages, then damages the pool's files from outside (byte flips, garbage runs,
interesting 64/32-bit words, truncations, growth) and runs operations on it in forked children,
one or two at once, through a handle mapped before the damage or one opened after it.

Oracle, per example: every child finishes within ``OP_TIMEOUT_S`` (no hang) without dying of a
signal or raising anything but ``PoolError`` (no crash); no ``get_into`` hit returns bytes other
than those put under that key (no wrong bytes); afterwards a valid put/get works in every
process (the pool reset itself, or the damage was harmless). Counts per target are printed
(``-s``) and written as JSON to ``$POOL_FUZZ_REPORT`` if set. ``POOL_FUZZ_EXAMPLES`` (default 40
per target) and ``POOL_FUZZ_RANDOM=1`` (a fresh random seed instead of the fixed one) widen it.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pool_fault_tools import Child, page

from sglang_patch.pool.base import PoolError
from sglang_patch.pool.shm_pool import ShmPagePool, destroy_pool

PAGE, CAP, KEYS = 512, 8, 6
OP_TIMEOUT_S = 10.0
EXAMPLES = int(os.environ.get("POOL_FUZZ_EXAMPLES", "40"))
TARGETS = ("meta", "segment", "both", "reopen", "concurrent")
WORDS = [0, 1, 2, 3, 7, 8, CAP - 1, CAP, 2**31 - 1, 2**32 - 1, 2**63, 2**64 - 1, 2**64 - 2]
COUNTS: dict[str, collections.Counter[str]] = {t: collections.Counter() for t in TARGETS}


def _data(i: int) -> np.ndarray:
    return page(10_000 + i, PAGE)


damage = st.tuples(
    st.sampled_from(["flip", "garbage", "word64", "word32", "truncate", "grow"]),
    st.floats(0, 1, allow_nan=False),  # where, as a fraction of the file
    st.binary(min_size=1, max_size=24),
    st.sampled_from(WORDS),
)


def _damage(path: str, kind: str, where: float, blob: bytes, word: int) -> None:
    size = os.path.getsize(path)
    at = min(int(where * size), max(size - 1, 0))
    if kind == "truncate":
        os.truncate(path, at)
        return
    with open(path, "r+b") as fh:
        if kind == "grow":
            fh.seek(0, os.SEEK_END)
            fh.write(blob)
        elif kind == "flip" and size:
            fh.seek(at)
            byte = fh.read(1)
            fh.seek(at)
            fh.write(bytes([byte[0] ^ (blob[0] or 1)]))
        elif kind == "garbage":
            fh.seek(at)
            fh.write(blob)
        elif kind in ("word64", "word32"):
            width = 8 if kind == "word64" else 4
            fh.seek(at - at % width)
            fh.write((word % 2 ** (8 * width)).to_bytes(width, "little"))


def _ops(pool: ShmPagePool | None, pool_id: str) -> dict[str, Any]:
    """Every public operation on the damaged pool, then a valid put/get (one retry: the
    operation that finds the pool rebuilt with another geometry is a miss)."""
    try:
        p = pool if pool is not None else ShmPagePool(pool_id, PAGE, CAP * PAGE)
    except PoolError as exc:
        return {"typed": repr(exc)}
    wrong = hits = 0
    for rnd in range(2):
        for i in range(KEYS):
            out = np.zeros(PAGE, np.uint8)
            if p.get_into(f"k{i}", [out]):
                hits += 1
                wrong += not np.array_equal(out, _data(i))
            p.exists(f"k{i}")
        p.put(f"new{rnd}", [page(rnd, PAGE)], tag=rnd)
        p.remove(f"k{rnd}")
        p.stats()
    works = False
    for attempt in range(2):
        out = np.zeros(PAGE, np.uint8)
        key = f"final{os.getpid()}-{attempt}"
        if p.put(key, [page(7, PAGE)]).stored and p.get_into(key, [out]):
            works = np.array_equal(out, page(7, PAGE))
            break
    stats = p.stats()
    # getattr: the same fuzz runs against the pool before PoolStats had resets (negative control)
    return {"wrong": wrong, "hits": hits, "works": works, "resets": getattr(stats, "resets", 0),
            "bad_sums": stats.checksum_failures}


def _classify(target: str, results: list[tuple[str, Any]]) -> list[str]:
    """Outcome labels of one example (also counted); failures are the labels the oracle forbids."""
    counts = COUNTS[target]
    counts["tried"] += 1
    failures = []
    for kind, value in results:
        if kind == "hang":
            failures.append("hang")
        elif kind != "ok":
            failures.append(f"crash {kind}: {value}")
        elif "typed" in value:
            counts["typed error on open"] += 1
        else:
            if value["wrong"]:
                failures.append("wrong bytes")
            if not value["works"]:
                failures.append("broken after")
    if not failures:
        values = [v for k, v in results if k == "ok" and "resets" in v]
        if any(v["resets"] for v in values):
            counts["clear error (reset)"] += 1
        elif any(v["bad_sums"] for v in values):
            counts["clear error (checksum miss)"] += 1
        elif any("typed" in v for _, v in results):
            pass
        else:
            counts["harmless"] += 1
    for failure in failures:
        counts[failure.split(":")[0]] += 1
    return failures


def _run(target: str, damages: list[tuple[str, float, bytes, int]], second: bool) -> None:
    pool_id = f"fuzz-{uuid.uuid4().hex[:10]}"
    try:
        pool = ShmPagePool(pool_id, PAGE, CAP * PAGE)
        for i in range(KEYS):
            pool.put(f"k{i}", [_data(i)], tag=i)
        meta, seg = os.path.join(pool.dir, "meta"), os.path.join(pool.dir, "seg-0")
        for n, (kind, where, blob, word) in enumerate(damages):
            on_meta = target in ("meta", "reopen", "concurrent") or (target == "both" and n % 2)
            _damage(meta if on_meta else seg, kind, where, blob, word)
        mapped = None if target == "reopen" else pool
        if target == "concurrent":
            children = [Child(_ops, pool, pool_id), Child(_ops, None, pool_id)]
        else:
            children = [Child(_ops, mapped, pool_id)]
        results = [c.result(OP_TIMEOUT_S) for c in children]
        if second:  # a process that kept its pre-damage mapping must work after the repair
            results.append(Child(_ops, pool, pool_id).result(OP_TIMEOUT_S))
        failures = _classify(target, results)
        assert not failures, (damages, results)
    finally:
        destroy_pool(pool_id)


@pytest.mark.parametrize("target", TARGETS)
def test_pool_survives_damaged_files(target):
    @settings(max_examples=EXAMPLES, database=None, suppress_health_check=list(HealthCheck),
              derandomize=os.environ.get("POOL_FUZZ_RANDOM") != "1")
    @given(st.lists(damage, min_size=1, max_size=5), st.booleans())
    def fuzz(damages, second):
        _run(target, damages, second)

    fuzz()
    counts = dict(COUNTS[target])
    print(f"\npool fuzz {target}: {counts}")
    report = os.environ.get("POOL_FUZZ_REPORT")
    if report:
        path = pathlib.Path(report)
        have = json.loads(path.read_text()) if path.exists() else {}
        have[target] = counts
        path.write_text(json.dumps(have, indent=1, sort_keys=True))
    assert not [label for label in counts
                if label.startswith(("hang", "crash", "wrong bytes", "broken after"))]
