"""``python index_probe.py HOST:PORT TOKEN OP_JSON``: one call on the index service, from the
network namespace it is run in (``test_across_hosts_e2e.py`` runs it on a test host: gRPC makes
its connections on threads of its own, which a thread that entered a namespace cannot lend).

OPs (the answer is one JSON object on stdout):
- ``{"register": [WorkerInfo fields, ...]}`` -> ``{"subscribed": [bool, ...]}``
- ``{"match": {"namespace", "model", "page_size", "messages"}}``: the chat prompt's page keys
  (the router's tokenizer and chat template) matched on the service, waiting (at most 30 s) for
  its events to cover at least one page -> ``{"best_worker", "gpu_pages": {worker: pages}}``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from radix_global.client import IndexClient
from radix_global.keys import page_keys
from radix_global.registration import WorkerInfo
from radix_global.types import Namespace
from router.keying.tokenize import TokenizerCache


def match(client: IndexClient, spec: dict[str, Any]) -> dict[str, Any]:
    ids = TokenizerCache().get(spec["model"]).encode_chat(spec["messages"])
    keys = page_keys(ids, int(spec["page_size"]))
    deadline = time.monotonic() + 30
    while True:
        found = client.match(Namespace(spec["namespace"]), keys)
        gpu = {str(holder): held.gpu for (holder, _), held in found.matched.items() if held.gpu}
        if gpu or time.monotonic() > deadline:
            best = max(gpu, key=lambda w: gpu[w]) if gpu else None
            return {"best_worker": best, "gpu_pages": gpu, "query_pages": found.query_pages}
        time.sleep(0.2)


def main(target: str, token: str, op: dict[str, Any]) -> dict[str, Any]:
    with IndexClient(target, admin_token=token, timeout_s=10.0) as client:
        if "register" in op:
            return {"subscribed": [client.register(WorkerInfo(**r)) for r in op["register"]]}
        return match(client, op["match"])


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
