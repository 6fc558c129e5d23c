"""``python mooncake_keys.py MASTER HOSTNAME``: a raw Mooncake client (no pool of ours) that
does to the store what the store or a broken host could do, from the test host it runs on
(``test_mooncake_pool_e2e.py``; Mooncake's listeners bind every interface: only in a namespace).
It stays up, answering one JSON op per stdin line with one JSON line, until stdin closes: what
it puts lives in its own segment, which leaves the store with it.

OPs:
- ``{"corrupt": [key, ...]}``: each existing object replaced by one of the same size whose bytes
  are float32 ones and whose checksum is wrong -> ``{"corrupted": n}``
- ``{"fill": MIB}``: that many 1 MiB objects of filler, past the store's high watermark, so
  that Mooncake evicts (silently) -> ``{"stored": n}``
- ``{"exist": [key, ...]}`` -> ``{"exist": [bool, ...]}``
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import numpy as np

SEGMENT = 32 << 20


def answer(store: Any, op: dict[str, Any]) -> dict[str, Any]:
    if "corrupt" in op:
        done = 0
        for key in op["corrupt"]:
            size = store.get_size(key)
            if size <= 8 or store.remove(key, True) != 0:
                continue
            ones = np.ones((size - 8) // 4, np.float32).tobytes()
            done += store.put(key, ones + bytes(size - len(ones))) == 0
        return {"corrupted": done}
    if "fill" in op:
        blob, tag = bytes(1 << 20), uuid.uuid4().hex[:8]
        return {"stored": sum(store.put(f"filler-{tag}-{i}", blob) == 0
                              for i in range(int(op["fill"])))}
    return {"exist": [store.is_exist(k) == 1 for k in op["exist"]]}


def main(master: str, hostname: str) -> None:
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    if store.setup(hostname, "P2PHANDSHAKE", SEGMENT, SEGMENT, "tcp", "", master) != 0:
        raise SystemExit(f"setup against {master} failed")
    try:
        for line in sys.stdin:
            print(json.dumps(answer(store, json.loads(line))), flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
