"""One Mooncake pool client in a test host (``test_mooncake_pool.py`` runs it in a namespace:
Mooncake's listeners bind every interface, so never outside one).

    python mooncake_driver.py MASTER HOSTNAME write N   # put N pages, then serve stdin commands
    python mooncake_driver.py MASTER HOSTNAME read N    # get N pages, print a JSON verdict
    python mooncake_driver.py MASTER HOSTNAME fill N    # put N pages into a small segment,
                                                        # then compare vanished() to the store
    python mooncake_driver.py MASTER HOSTNAME stall N   # read page 0, then 1..N-1 when told

A fifth argument sets the page size (``PAGE`` bytes by default), for the writer and its readers
alike.

Pages are ``PAGE`` bytes in ``CHUNKS`` chunks (a layer-first page is several buffers), page ``i``
filled from seed ``i``. ``write`` and ``read`` move the first half of the pages one call each,
packed through the staging slots (``put`` / ``get_into`` of private arrays), and the second half
zero-copy in one call, as the storage backend does with chunks this large: chunks inside one
registered region (``register_memory``), one ``put_many`` / ``get_many``. The writer prints
``{"ready": ...}`` and then answers stdin lines:
``corrupt I`` (replace page ``i`` in the store by same-sized bytes with a wrong checksum, through
the raw client) and ``quit``. Its segment holds its pages: it stays alive until told to quit or
killed.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from sglang_patch.pool.base import PageIO
from sglang_patch.pool.mooncake_pool import CHECKSUM_BYTES, MooncakePagePool

PAGE = 64 * 1024
CHUNKS = 4
SEGMENT = 64 << 20


def key(i: int) -> str:
    return f"tiny@test/{i:064x}"


def page(i: int) -> list[np.ndarray]:
    data = np.random.default_rng(i).integers(0, 256, PAGE, dtype=np.uint8)
    return list(np.split(data, CHUNKS))


def region_pages(pool: MooncakePagePool, n: int) -> list[list[np.ndarray]]:
    """``n`` pages' chunks as views of one array registered with the pool (SGLang's host pool
    stands in this way)."""
    region = np.zeros(n * PAGE, dtype=np.uint8)
    pool.register_memory(region)
    return [list(np.split(region[i * PAGE:(i + 1) * PAGE], CHUNKS)) for i in range(n)]


def write(pool: MooncakePagePool, n: int) -> None:
    half, direct = n // 2, region_pages(pool, n)
    for i in range(half, n):
        for dst, src in zip(direct[i], page(i), strict=True):
            dst[:] = src
    results = [pool.put(key(i), page(i), tag=i) for i in range(half)]
    results += pool.put_many([PageIO(key(i), direct[i], i) for i in range(half, n)])
    print(json.dumps({"ready": True, "stored": [r.stored for r in results],
                      "new": [r.new for r in results],
                      "again_new": pool.put(key(0), page(0)).new}), flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "corrupt":
            i = int(args[0])
            store = pool._store
            store.remove(key(i), True)
            bad = np.full(PAGE + CHECKSUM_BYTES, 7, dtype=np.uint8)  # wrong checksum
            print(json.dumps({"corrupted": store.put(key(i), bad.tobytes()) == 0}), flush=True)
        elif cmd == "quit":
            return


def read(pool: MooncakePagePool, n: int) -> None:
    half, direct = n // 2, region_pages(pool, n)
    dests = [[np.zeros(PAGE // CHUNKS, dtype=np.uint8) for _ in range(CHUNKS)]
             for _ in range(half)] + direct[half:]
    got = [pool.get_into(key(i), dests[i]) for i in range(half)]
    got += pool.get_many([PageIO(key(i), dests[i]) for i in range(half, n)])
    equal = [bool(ok and all((d == p).all() for d, p in zip(dests[i], page(i), strict=True)))
             for i, ok in enumerate(got)]
    print(json.dumps({"got": got, "equal": equal,
                      "exists": [pool.exists(key(i)) for i in range(n)],
                      "checksum_failures": pool.stats().checksum_failures,
                      "batch_calls": pool._counts["batch_calls"],
                      "zero_copy_calls": pool._counts["zero_copy_calls"],
                      "lost_skips": pool._counts["lost_skips"],
                      "lost_hosts": pool.lost_hosts()}), flush=True)


def stall(pool: MooncakePagePool, n: int) -> None:
    """Read page 0 (the session to its host opens), print ``{"ready": ...}``, wait for a stdin
    line, then read pages 1..n-1 in one call and print how long it took and what came back."""
    dests = [[np.zeros(PAGE // CHUNKS, dtype=np.uint8) for _ in range(CHUNKS)]
             for _ in range(n)]
    print(json.dumps({"ready": pool.get_into(key(0), dests[0])}), flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    got = pool.get_many([PageIO(key(i), dests[i]) for i in range(1, n)])
    elapsed = time.monotonic() - start
    wrong = [i for i, ok in enumerate(got, 1)
             if ok and not all((d == p).all() for d, p in zip(dests[i], page(i), strict=True))]
    print(json.dumps({"elapsed_s": elapsed, "got": sum(got), "wrong": wrong,
                      "lost_hosts": pool.lost_hosts()}), flush=True)


def fill(pool: MooncakePagePool, n: int) -> None:
    """More pages than the segment holds: Mooncake evicts some, silently."""
    stored = [i for i in range(n) if pool.put(key(i), page(i), tag=i).stored]
    found = sorted(pool.vanished(limit=n))
    missing = sorted(i for i in stored if not pool.exists(key(i)))
    print(json.dumps({"stored": len(stored), "vanished": found, "missing": missing,
                      "again": pool.vanished(limit=n)}), flush=True)


def main(master: str, hostname: str, mode: str, n: int, page_bytes: int = PAGE) -> None:
    global PAGE
    PAGE = page_bytes
    segment = SEGMENT if mode != "fill" else 16 << 20  # Mooncake's smallest
    pool = MooncakePagePool("mooncake-test", PAGE, master, hostname, segment,
                            zero_copy_min_chunk=PAGE // CHUNKS, probe_spread=1)  # all in a round
    try:
        {"write": write, "read": read, "fill": fill, "stall": stall}[mode](pool, n)
    finally:
        pool.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), *map(int, sys.argv[5:6]))
