"""A namespace's pool fetches are priced with the KV bytes per token its workers report
(``WorkerInfo.kv_bytes_per_token``: registration, or a command-line worker's ``/server_info``),
not with LLaMA3-70B's whatever the model (router/state.py ``_worker_added``,
router/cluster/discovery.py, docs/interfaces.md section "Worker registration").

Decision difference: on a 1 GB/s pool link, fetching 1,024 tokens of a 70B model (335 MB, 0.34 s)
loses to recomputing them (62 ms by the default prior), while the same fetch of the tiny test
model (6 KB/token, 6 ms) wins.
"""

from __future__ import annotations

import pytest

from radix_global.ops import StorePages
from radix_global.registration import WorkerInfo
from radix_global.types import Location, Namespace, PageKey, PoolId, Tier, WorkerId
from router.cluster.discovery import ModelOverrides, info_from_server_info, split_worker_spec
from router.cluster.registry import Source
from router.cluster.slots import worker_states
from router.config import RouterConfig
from router.routing.contract import RouteRequest
from router.routing.cost import LLAMA3_70B_KV_BYTES_PER_TOKEN
from router.state import RouterState

NS = "tiny@1"
PS = 16
TINY_KV = 6 * 2 * 64 * 2 * 4  # 6 layers x 2 KV heads x 64 dims x (K, V) x float32
PROMPT = [PageKey(9000 + i) for i in range(64)]  # 1,024 tokens, all in the pool
POOL = PoolId("pool-a")


def info(kv_bytes: int | None) -> WorkerInfo:
    return WorkerInfo(worker_id="w", url="http://127.0.0.1:1", model="tiny", namespace=NS,
                      page_size=PS, pool_id=str(POOL), kv_bytes_per_token=kv_bytes)


def joined(kv_bytes: int | None) -> RouterState:
    state = RouterState(RouterConfig.from_options(policy="conductor", profile_max_tokens=0,
                                                  default_bandwidth_bytes_per_s=1e9))
    state.registry.add(info(kv_bytes), Source.REGISTERED, 0.0)
    state.index.index.apply(StorePages(Namespace(NS), Location(POOL, 0, Tier.POOL), None,
                                       PROMPT))
    return state


def test_a_small_model_is_priced_with_its_own_bytes_per_token():
    small, unknown = joined(TINY_KV), joined(None)
    assert small.routing.cost.kv_bytes_per_token(Namespace(NS)) == TINY_KV
    assert unknown.routing.cost.kv_bytes_per_token(Namespace(NS)) == LLAMA3_70B_KV_BYTES_PER_TOKEN
    (slot,) = worker_states(small.registry.all())
    assert small.routing.cost.transfer_s(POOL, slot, 1024) == pytest.approx(1024 * TINY_KV / 1e9)
    assert unknown.routing.cost.transfer_s(POOL, slot, 1024) == pytest.approx(
        1024 * LLAMA3_70B_KV_BYTES_PER_TOKEN / 1e9)


def test_the_decision_follows_the_reported_size():
    def fetched(state: RouterState) -> int:
        req = RouteRequest("r1", Namespace(NS), len(PROMPT) * PS, PROMPT, PS)
        decision = state.routing.route(req, worker_states(state.registry.all()), 1.0)
        assert decision.accepted and decision.worker_id == WorkerId("w")
        return decision.fetch_tokens

    assert fetched(joined(TINY_KV)) == len(PROMPT) * PS
    assert fetched(joined(None)) == 0  # 70B bytes on this link: recomputing is faster


def test_command_line_worker_reports_its_pool_through_server_info():
    server = {"served_model_name": "tiny", "page_size": PS, "tp_size": 1,
              "internal_states": [{"memory_usage": {"kvcache": 0.573, "token_capacity": 100_000}}]}
    found, _, _ = info_from_server_info("http://127.0.0.1:30000", server, ModelOverrides())
    assert found.kv_bytes_per_token == round(0.573 * 2**30 / 100_000)
    # A fragment overrides it (vLLM reports neither), checked like the rest of the record.
    url, over = split_worker_spec("http://127.0.0.1:30000#kv_bytes_per_token=1000")
    found, _, _ = info_from_server_info(url, {}, ModelOverrides(), over)
    assert found.kv_bytes_per_token == 1000
    with pytest.raises(ValueError, match="kv_bytes_per_token must be an integer"):
        split_worker_spec("http://h:1#kv_bytes_per_token=big")
