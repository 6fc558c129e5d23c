"""``radix-global status``: once, and redrawn with ``--watch``, against a running router."""

from __future__ import annotations

import pytest

from router.cli.status import main as status_main


def test_status_command_prints_the_cluster(upstreams, router_factory, capsys):
    _, server = upstreams()
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    with router.client() as c:
        c.post("/generate", json={"input_ids": [1, 2, 3]})
    assert status_main(["--router", router.url]) == 0
    out = capsys.readouterr().out
    assert f"127.0.0.1:{server.port}" in out and "tiny" in out and "no_kv_events" in out
    assert status_main(["--router", "http://127.0.0.1:9"]) == 1


def test_watch_redraws_with_the_new_numbers(upstreams, router_factory, capsys):
    _, server = upstreams()
    router = router_factory(workers=(server.url,))
    router.wait_workers(1)
    with router.client() as c:
        for i in range(3):
            assert c.post("/generate", json={"input_ids": [1, 2, 3 + i]}).status_code == 200
    assert status_main(["--router", router.url, "--watch", "0.05", "--count", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip("│ ").startswith("tiny ")]
    assert rows and all(" 3 " in row for row in rows), out  # accepted, in the funnel table
    with pytest.raises(SystemExit, match="2"):  # refused by argparse
        status_main(["--router", router.url, "--watch", "0"])


def test_a_router_that_stops_answering_is_a_line_in_the_watch_not_its_end():
    import httpx

    from router.cli.status import _redraw

    with httpx.Client(base_url="http://127.0.0.1:9", timeout=1) as c:
        assert "retrying" in str(_redraw(c))
