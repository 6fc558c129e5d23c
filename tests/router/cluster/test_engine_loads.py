"""The engine-reported load source (router/cluster/engine_loads.py): SGLang's ``/v1/loads`` and
vLLM's ``/metrics`` parsed (payloads captured from a real SGLang 0.5.23 CPU worker and a real
vLLM 0.32.0 CPU server, in ``data/``), hostile answers refused, and the poller over
``httpx.MockTransport``: readings, staleness, a failing worker counted and logged once, a removed
worker forgotten."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from radix_global.registration import WorkerInfo
from radix_global.types import WorkerId
from router.cluster.engine_loads import (
    EngineLoad,
    EngineLoadConfig,
    EngineLoadError,
    EngineLoadPoller,
    parse_sglang_loads,
    parse_vllm_metrics,
)
from router.cluster.registry import Source, WorkerEntry
from router.cluster.slots import worker_states
from router.routing.contract import Slot
from router.routing.load_view import NO_LOAD, SlotLoad

DATA = Path(__file__).parent / "data"
SGLANG = json.loads((DATA / "sglang_0.5.23_v1_loads.json").read_text())
VLLM = (DATA / "vllm_0.32.0_metrics.txt").read_text()


ANSWERED = datetime.fromisoformat(SGLANG["timestamp"]).timestamp()
AGE = ANSWERED - SGLANG["loads"][0]["timestamp"]  # the captured snapshot's age when served


def rank(**over: Any) -> dict[str, Any]:
    """One dp rank as SGLang 0.5.23 writes it (``LoadSnapshot.to_dict``, core keys), its
    snapshot taken as the answer was (age 0)."""
    base = {**SGLANG["loads"][0], "timestamp": ANSWERED}
    base.update(over)
    return base


def loads_doc(*ranks: dict[str, Any]) -> dict[str, Any]:
    return {**SGLANG, "loads": list(ranks)}


def test_sglang_captured_answer() -> None:
    got = parse_sglang_loads(json.dumps(SGLANG).encode(), at=5.0)
    # captured busy: 1 running, 2020 of 8192 KV tokens in use; read at 5.0, its snapshot AGE
    # (0.15 s) older
    assert got == {0: EngineLoad(1, 0, 0, 8192 - 2020, pytest.approx(5.0 - AGE))}
    assert 0 < AGE < 1


def test_an_idle_engines_old_snapshot_is_dated_by_its_own_timestamp() -> None:
    doc = loads_doc(rank(timestamp=ANSWERED - 30.0))  # the last busy moment, 30 s ago
    assert parse_sglang_loads(doc, at=100.0)[0].at == pytest.approx(70.0)
    for bad in ("yesterday", None, float("nan"), True):  # undatable: as of the read
        assert parse_sglang_loads(loads_doc(rank(timestamp=bad)), at=100.0)[0].at == 100.0


def test_sglang_dp_ranks_queued_tokens_and_headroom() -> None:
    doc = loads_doc(
        rank(dp_rank=0, num_running_reqs=3, num_waiting_reqs=2, num_waiting_uncached_tokens=900,
             num_total_tokens=7000, max_total_num_tokens=8192),
        rank(dp_rank=1, num_running_reqs=0, num_waiting_reqs=0, num_waiting_uncached_tokens=0,
             num_total_tokens=9000, max_total_num_tokens=8192))  # queued prompts overbook it
    assert parse_sglang_loads(doc) == {0: EngineLoad(3, 2, 900, 1192, 0.0),
                                       1: EngineLoad(0, 0, 0, 0, 0.0)}


def test_sglang_optional_fields_missing_are_unknown() -> None:
    item = {"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 4}
    assert parse_sglang_loads({"loads": [item]}) == {0: EngineLoad(1, 4, None, None, 0.0)}
    used = {**item, "num_used_tokens": 100, "max_total_num_tokens": 1000}
    assert parse_sglang_loads({"loads": [used]})[0].kv_headroom_tokens == 900


@pytest.mark.parametrize("payload", [
    b"not json", b"\xff\xfe", "[" * 100_000, b"null", b"[]", b'{"loads": {}}', b'{"loads": []}',
    {"loads": [1]},
    {"loads": [rank(dp_rank=0), rank(dp_rank=0)]},
    {"loads": [rank(dp_rank=5000)]},
    {"loads": [rank(dp_rank=-1)]},
    {"loads": [rank(num_running_reqs=-1)]},
    {"loads": [rank(num_running_reqs=1.5)]},
    {"loads": [rank(num_running_reqs=True)]},
    {"loads": [rank(num_running_reqs="3")]},
    {"loads": [rank(num_running_reqs=None)]},
    {"loads": [rank(num_waiting_reqs=10**30)]},
    {"loads": [rank(num_waiting_uncached_tokens=float("nan"))]},
    {"loads": [rank(max_total_num_tokens=float("inf"))]},
    {"loads": [{k: v for k, v in rank().items() if k != "num_waiting_reqs"}]},
    {"loads": [rank()] * 2000},
    b'{"loads": [{"dp_rank": 0, "num_running_reqs": NaN, "num_waiting_reqs": 0}]}',
    b" " * (9 << 20),
])
def test_sglang_hostile_answers_are_refused(payload: Any) -> None:
    with pytest.raises(EngineLoadError):
        parse_sglang_loads(payload)


def test_vllm_captured_metrics() -> None:
    # captured idle: capacity from cache_config_info's kv_cache_size_tokens
    assert parse_vllm_metrics(VLLM, at=2.0) == EngineLoad(0, 0, None, 349440, 2.0)


def vllm_text(running: str = "3.0", waiting: str = "2.0", usage: str = "0.25",
              engines: tuple[str, ...] = ("0",)) -> str:
    lines = [ln for ln in VLLM.splitlines() if not ln.startswith(
        ("vllm:num_requests_running{", "vllm:num_requests_waiting{",
         "vllm:kv_cache_usage_perc{", "vllm:cache_config_info{"))]
    for e in engines:
        lab = f'engine="{e}",model_name="tiny"'
        lines += [f"vllm:num_requests_running{{{lab}}} {running}",
                  f"vllm:num_requests_waiting{{{lab}}} {waiting}",
                  f"vllm:kv_cache_usage_perc{{{lab}}} {usage}",
                  f'vllm:cache_config_info{{block_size="128",engine="{e}",'
                  f'kv_cache_size_tokens="None",num_gpu_blocks="100"}} 1.0']
    return "\n".join(lines) + "\n"


def test_vllm_busy_and_several_engines() -> None:
    assert parse_vllm_metrics(vllm_text()) == EngineLoad(3, 2, None, 9600, 0.0)
    # summed over engines; headroom: the most one engine has free
    assert parse_vllm_metrics(vllm_text(engines=("0", "1"))) == EngineLoad(6, 4, None, 9600, 0.0)
    no_capacity = vllm_text().replace('num_gpu_blocks="100"', 'num_gpu_blocks="None"')
    assert parse_vllm_metrics(no_capacity).kv_headroom_tokens is None


@pytest.mark.parametrize("payload", [
    "", "hello", "<html>not metrics</html>", b"\xff\xfe\x00",
    "vllm:num_requests_running{engine=\"0\"} 1.0\n",  # no waiting
    "vllm:num_requests_running{engine=\"0\" 1.0\nvllm:num_requests_waiting 1\n",
    vllm_text(running="-1.0"), vllm_text(running="NaN"), vllm_text(running="+Inf"),
    vllm_text(waiting="1.5"), vllm_text(waiting="1e30"), vllm_text(usage="1.5"),
    vllm_text(usage="-0.1"), vllm_text(usage="NaN"), "#" * (9 << 20),
])
def test_vllm_hostile_metrics_are_refused(payload: Any) -> None:
    with pytest.raises(EngineLoadError):
        parse_vllm_metrics(payload)


class _View:
    def __init__(self, engine: EngineLoad | None, peer: SlotLoad = NO_LOAD) -> None:
        self._engine, self._peer = engine, peer

    def peer(self, slot: Slot) -> SlotLoad:
        return self._peer

    def engine(self, slot: Slot) -> EngineLoad | None:
        return self._engine


def test_worker_states_fill_the_engine_and_peer_fields() -> None:
    entry = WorkerEntry(WorkerInfo(worker_id="w", url="http://w", model="m", namespace="m@1",
                                   page_size=16), Source.CLI)
    (plain,) = worker_states([entry], view=_View(None))
    assert plain == worker_states([entry])[0]
    (got,) = worker_states([entry], view=_View(EngineLoad(1, 2, 3, 4, 9.0), SlotLoad(5, 1, 6, 7)))
    assert (got.running, got.waiting, got.waiting_tokens, got.kv_headroom_tokens) == (1, 2, 3, 4)
    assert (got.peer_requests, got.peer_prefill_tokens, got.peer_decode_tokens) == (5, 6, 7)


class Engines:
    """The fake cluster: per host, what it answers (a callable may raise a transport error)."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(f"{request.url.host}{request.url.raw_path.decode()}")
        answer = self.answers[request.url.host]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        if isinstance(answer, str):
            return httpx.Response(200, text=answer)
        return httpx.Response(200, json=answer)


def test_poller_reads_goes_stale_counts_failures_and_forgets(caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    engines = Engines()
    engines.answers = {
        "sg": loads_doc(rank(dp_rank=0, num_running_reqs=2), rank(dp_rank=1, num_waiting_reqs=7),
                        rank(dp_rank=2)),  # rank 2 beyond the worker's dp_size: ignored
        "vl": vllm_text(),
        "down": httpx.ConnectError("refused"),
        "old": httpx.Response(404, text="Not Found"),
        "web": "<html>an OpenAI server that is not vLLM</html>",
    }
    workers = [("s", "http://sg", "sglang", 2), ("v", "http://vl/", "vllm", 1),
               ("d", "http://down", "sglang", 1), ("o", "http://old", "sglang", 1),
               ("x", "http://web", "other", 1)]
    now = [100.0]
    registry = CollectorRegistry()

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(engines)) as client:
            poller = EngineLoadPoller(client, EngineLoadConfig(poll_s=1.0), lambda: workers,
                                      clock=lambda: now[0])
            poller.bind_metrics(registry)
            with caplog.at_level(logging.WARNING, "radix_global.router.cluster.engine_loads"):
                for _ in range(3):
                    await poller.poll_once()
            assert poller.load((WorkerId("s"), 0)) == EngineLoad(2, 0, 0, 8192 - 2020, 100.0)
            assert poller.load((WorkerId("s"), 1)) == EngineLoad(1, 7, 0, 8192 - 2020, 100.0)
            assert poller.load((WorkerId("s"), 2)) is None
            assert poller.load((WorkerId("v"), 0)) == EngineLoad(3, 2, None, 9600, 100.0)
            assert poller.load((WorkerId("d"), 0)) is None
            assert poller.failures == {"connect": 3, "status": 3, "parse": 1}
            # each failing worker logged once; the non-vLLM "other" is not read again
            assert len(caplog.records) == 3
            assert engines.paths.count("web/metrics") == 1
            assert "sg/v1/loads?include=core" in engines.paths and "vl/metrics" in engines.paths
            assert registry.get_sample_value("radix_global_engine_load_failures_total",
                                             {"worker": "d", "kind": "connect"}) == 3
            # stale after stale_polls x poll_s without a fresh reading
            now[0] = 103.0
            assert poller.load((WorkerId("v"), 0)) is not None
            now[0] = 103.5
            engines.answers["vl"] = httpx.ReadTimeout("slow")
            await poller.poll_once()
            assert poller.load((WorkerId("v"), 0)) is None
            assert poller.failures["timeout"] == 1
            # the engine answers again: fresh, and a new streak would be logged again
            engines.answers["vl"] = vllm_text(running="0.0", waiting="0.0")
            await poller.poll_once()
            assert poller.load((WorkerId("v"), 0)) == EngineLoad(0, 0, None, 9600, 103.5)
            # a removed worker is forgotten at once
            workers[:] = [w for w in workers if w[0] != "s"]
            await poller.poll_once()
            assert poller.load((WorkerId("s"), 0), now=103.5) is None
            assert not any(slot[0] == "s" for slot in poller._loads)

    asyncio.run(run())


def test_poller_start_stop_and_off() -> None:
    engines = Engines()
    engines.answers["vl"] = vllm_text()

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(engines)) as client:
            off = EngineLoadPoller(client, EngineLoadConfig(poll_s=0), lambda: [])
            off.start()
            assert off._task is None
            poller = EngineLoadPoller(client, EngineLoadConfig(poll_s=0.01),
                                      lambda: [("v", "http://vl", "vllm", 1)])
            poller.start()
            for _ in range(200):
                if len(engines.paths) >= 3:
                    break
                await asyncio.sleep(0.01)
            await poller.stop()
            assert len(engines.paths) >= 3 and poller.load((WorkerId("v"), 0)) is not None

    asyncio.run(run())


def test_a_hanging_engine_times_out() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, text=vllm_text())

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(hang)) as client:
            poller = EngineLoadPoller(client, EngineLoadConfig(timeout_s=0.05),
                                      lambda: [("v", "http://vl", "vllm", 1)])
            await poller.poll_once()
            assert poller.failures == {"timeout": 1} and poller.load((WorkerId("v"), 0)) is None

    asyncio.run(run())
