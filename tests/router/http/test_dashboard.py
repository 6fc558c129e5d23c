"""``/dashboard`` in a real headless browser (Debian's ``chromium``): refused without the admin
token, it renders, its numbers are ``/admin/stats``'s, a number on it moves after N known
requests, and a screenshot is saved under ``benchmarks/results/``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
TOKEN = "dash-t0ken"
RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
N = 3


class _Paths(HTMLParser):
    """The text of every element that carries ``data-path``."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self._open: list[str | None] = []
        self.updated: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.updated = a.get("data-updated")
        self._open.append(a.get("data-path"))

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if self._open and self._open[-1] is not None:
            self.values[self._open[-1]] = self.values.get(self._open[-1], "") + data


def _browse(url: str, *extra: str) -> str:
    chromium = shutil.which("chromium")
    assert chromium, "chromium is installed by scripts/bootstrap.sh"
    out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", "--disable-extensions", "--window-size=1280,1700",
                          "--virtual-time-budget=5000", *extra, url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _page(url: str) -> _Paths:
    parser = _Paths()
    parser.feed(_browse(url, "--dump-dom"))
    assert parser.updated, "the page never rendered /admin/stats"
    return parser


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if text == "n/a":
        return None
    return float(text.rstrip(" %")) / (100 if text.endswith("%") else 1)


def _stat(stats: dict, path: str) -> object:
    """The value at ``path`` (the page's ``data-path``: a JSON list of keys) in ``stats``."""
    node: object = stats
    for part in json.loads(path):
        if isinstance(node, list):  # workers: by id
            node = next(w for w in node if w["worker_id"] == part)
        else:
            assert isinstance(node, dict)
            node = node[part]
    return node


def test_the_page_renders_the_routers_numbers_behind_the_token(upstreams, router_factory):
    _, server = upstreams()
    router = router_factory(workers=(server.url,), admin_token=TOKEN)
    router.wait_workers(1)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with router.client() as c:
        refused = c.get("/dashboard")
        assert refused.status_code == 401 and "Basic" in refused.headers["www-authenticate"]
        assert c.get("/admin/hot").status_code == 401
        assert c.get("/dashboard", headers={"Authorization": "Basic " + "eDp3cm9uZw=="}
                     ).status_code == 401  # x:wrong
        assert "<title>radix-global router</title>" in c.get("/dashboard", headers=auth).text
        for i in range(N):
            assert c.post("/generate", json={"input_ids": [5, 6, 7 + i]}).status_code == 200
        url = router.url.replace("http://", f"http://admin:{TOKEN}@") + "/dashboard"
        before = _page(url)
        stats = c.get("/admin/stats", headers=auth).json()
        model = next(iter(stats["admission"]["models"]))
        shown = {p: _number(v) for p, v in before.values.items()}
        key = json.dumps(["admission", "models", model, "accepted"], separators=(",", ":"))
        assert key in shown, sorted(shown)
        assert len(shown) >= 8, sorted(shown)
        for path, value in shown.items():
            want = _stat(stats, path)
            assert value == pytest.approx(want, abs=0.006) if want is not None \
                else value is None, (path, value, want)
        for i in range(N):
            assert c.post("/generate", json={"input_ids": [9, 9, 9 + i]}).status_code == 200
        after = _page(url)
        assert _number(after.values[key]) == _number(before.values[key]) + N  # type: ignore[operator]
    RESULTS.mkdir(exist_ok=True)
    shot = RESULTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    _browse(url, f"--screenshot={shot}")
    assert shot.stat().st_size > 10_000 and re.match(rb"\x89PNG", shot.read_bytes()[:4])

