"""An instant worker on the standard library (the wheel's venvs hold none of the test
dependencies): the engine protocol the router needs, /health, /server_info, /generate."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler
from typing import Any


class Upstream(BaseHTTPRequestHandler):
    """An instant worker speaking the engine protocol the router needs: /health, /server_info,
    /generate (as tests/router/http_peer.py's Upstream, on the standard library)."""

    generated: list[dict[str, Any]] = []

    def _send(self, status: int, body: dict[str, Any] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200)
        elif self.path == "/server_info":
            self._send(200, {"served_model_name": "tiny", "model_path": None,
                             "tokenizer_path": None, "page_size": 4, "context_length": 512,
                             "dp_size": 1, "kv_events_config": None,
                             "disaggregation_mode": "null"})
        else:
            self._send(404, {"error": self.path})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/generate":
            self.generated.append(body)
            self._send(200, {"text": "hello from upstream",
                             "meta_info": {"cached_tokens": 0, "prompt_tokens": 3,
                                           "id": body.get("rid")}})
        else:
            self._send(200, {})

    def log_message(self, *args: Any) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
