"""sglang_patch/pool/load_reports.py: the backend's timed loads reach the router in bounded
reports, never blocking SGLang's threads and never raising into them."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from radix_global.pool_loads import MAX_LOADS_PER_REPORT, PoolLoadReport, decode_report
from sglang_patch.pool.load_reports import LoadReporter, http_send


def reporter(send, max_waiting: int = 1024) -> LoadReporter:
    return LoadReporter("shm-h", send, interval_s=3600, max_waiting=max_waiting)


def test_loads_go_out_in_reports_of_at_most_256_and_nonsense_is_not_kept() -> None:
    bodies: list[bytes] = []
    r = reporter(bodies.append)
    for i in range(300):
        r.add(i, 2, 100, 0.01)
    r.add(1, 0, 100, 0.01)
    r.add(1, 1, 100, 0.0)
    assert r.flush() == 300
    reports = [decode_report(b) for b in bodies]
    assert [len(x.loads) for x in reports] == [MAX_LOADS_PER_REPORT, 44]
    assert reports[0].pool_id == "shm-h" and reports[1].loads[-1].first == 299
    assert r.flush() == 0
    r.close()


def test_a_full_queue_drops_the_oldest_and_a_refused_report_is_counted() -> None:
    def refuse(body: bytes) -> None:
        raise httpx.ConnectError("no router")

    r = reporter(refuse, max_waiting=2)
    for i in range(3):
        r.add(i, 1, 1, 1.0)
    assert r.dropped == 1
    assert r.flush() == 0 and r.failed == 1
    r.close()


def test_http_send_posts_to_the_first_router_that_answers_with_the_token() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1":
            raise httpx.ConnectError("down")
        seen.append(request)
        return httpx.Response(200, json={"applied": 1})

    send = http_send("http://r1:1,http://r2:1", "tok", transport=httpx.MockTransport(handler))
    body = msgspec.json.encode(PoolLoadReport("shm-h", []))
    send(body)
    assert [str(x.url) for x in seen] == ["http://r2:1/admin/pool-loads"]
    assert seen[0].headers["authorization"] == "Bearer tok" and seen[0].content == body

    def bad(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "bad"}})

    with pytest.raises(httpx.HTTPStatusError):
        http_send("http://r1:1", None, transport=httpx.MockTransport(bad))(body)
