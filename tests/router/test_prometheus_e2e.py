"""A real Prometheus (Debian's ``prometheus``) scrapes a router and an index service after a
known workload: every query of every panel of ``monitoring/grafana-dashboard.json`` returns at
least one series, and the scraped counters are the router's own numbers."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from waits import until

from radix_global.index_http import serve_metrics
from radix_global.service import IndexServer, ServiceConfig
from sglang_patch.ports import free_port

pytestmark = pytest.mark.e2e
DASHBOARD = Path(__file__).resolve().parents[2] / "monitoring" / "grafana-dashboard.json"
STREAMS = 5


class _IndexService:
    """A standalone index service with ``/metrics``, on a loop of its own."""

    def __enter__(self) -> _IndexService:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def start() -> tuple[IndexServer, Any]:
            server = await IndexServer(ServiceConfig()).start()
            return server, await serve_metrics("127.0.0.1", 0, server.state.index.stats,
                                               server.state.subscriber.stats)

        self.server, self.metrics = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            await self.metrics.stop()
            await self.server.stop(0.1)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _prometheus(tmp_path: Path, targets: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus (Debian's) is installed by scripts/bootstrap.sh"
    scrape = [{"job_name": job, "scrape_interval": "1s", "metrics_path": "/metrics",
               "static_configs": [{"targets": [target]}]} for job, target in targets.items()]
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"},
                                  "scrape_configs": scrape}))  # JSON is YAML
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([binary, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, (expr, r.text)
    return list(r.json()["data"]["result"])


def test_every_dashboard_panel_has_data_from_a_real_prometheus(upstreams, router_factory,
                                                                tmp_path):
    peer, server = upstreams()
    router = router_factory(workers=(server.url,), policy="conductor", ttft_slo_s=30)
    router.wait_workers(1)
    with router.client() as c:
        for i in range(STREAMS):
            r = c.post("/generate", json={"input_ids": [5, 6, 7, 8, 9 + i], "stream": True})
            assert r.status_code == 200, r.text
        peer.mode = "die_mid_stream"  # one broken stream: an upstream error
        assert c.post("/generate", json={"input_ids": [1, 2, 3], "stream": True}
                      ).status_code == 200
        peer.mode = "ok"
    with _IndexService() as index:
        proc, base = _prometheus(tmp_path, {
            "radix-global-router": router.url.removeprefix("http://"),
            "radix-global-index": f"127.0.0.1:{index.metrics.port}"})
        try:
            def ready() -> bool:
                try:
                    return httpx.get(f"{base}/-/ready", timeout=5).status_code == 200
                except httpx.TransportError:
                    return False

            def scraped_twice() -> bool:
                ups = _query(base, "count_over_time(up[1m])")
                return len(ups) == 2 and all(float(u["value"][1]) >= 3 for u in ups)

            until(ready, "prometheus never became ready", timeout_s=60)

            until(scraped_twice, "prometheus never scraped both targets three times",
                  timeout_s=60)
            assert all(u["value"][1] == "1" for u in _query(base, "up")), _query(base, "up")
            stats = router.state.admission.stats()["models"]["tiny"]
            accepted = _query(base, 'sum(radix_global_decisions_total{outcome="accepted"})')
            assert float(accepted[0]["value"][1]) == stats["accepted"] == STREAMS + 1
            met = _query(base, 'sum(radix_global_slo_requests_total{slo="ttft"})')
            assert float(met[0]["value"][1]) == stats["ttft_met"] + stats["ttft_missed"]
            panels = json.loads(DASHBOARD.read_text())["panels"]
            empty = []
            for panel in panels:
                for target in panel["targets"]:
                    expr = target["expr"].replace("$__rate_interval", "1m")
                    if not _query(base, expr):
                        empty.append((panel["title"], expr))
            assert len(panels) >= 10 and empty == [], empty
        finally:
            proc.terminate()
            proc.wait(30)
