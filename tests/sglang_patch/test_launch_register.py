"""Registrar protocol logic (docs/interfaces.md, "Worker registration") against a recording HTTP
handler."""

from __future__ import annotations

import httpx
import pytest

from radix_global.registration import WorkerInfo, decode_worker_info
from sglang_patch.register import Registrar, RegistrationRefused, model_version, namespace_for

INFO = WorkerInfo(worker_id="w1", url="http://127.0.0.1:1", model="m", namespace="m@1",
                  page_size=4, pool_id="p1", pool_events_endpoint="tcp://127.0.0.1:2")


class Router:
    def __init__(self, token: str = "t") -> None:
        self.token, self.known, self.calls = token, set(), []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return httpx.Response(401, text="bad token")
        path = request.url.path
        if request.method == "POST" and path == "/admin/workers":
            info = decode_worker_info(request.content)
            self.known.add(info.worker_id)
            return httpx.Response(201, json={"worker_id": info.worker_id})
        wid = path.split("/")[3]
        if path.endswith("/heartbeat"):
            return httpx.Response(200 if wid in self.known else 404)
        if request.method == "DELETE":
            self.known.discard(wid)
            return httpx.Response(200)
        return httpx.Response(405)


def registrar(router: Router, token: str = "t") -> Registrar:
    client = httpx.Client(transport=httpx.MockTransport(router), base_url="http://r")
    return Registrar("http://r", INFO, admin_token=token, client=client, connect_timeout_s=1)


def test_register_heartbeat_reregister_and_delete():
    router = Router()
    reg = registrar(router)
    reg.register()
    reg.heartbeat()
    router.known.clear()  # the router restarted and forgot us
    reg.heartbeat()
    assert reg.registrations == 2 and "w1" in router.known
    reg.stop()
    assert router.calls[-1] == ("DELETE", "/admin/workers/w1") and "w1" not in router.known


def test_wrong_token_is_a_clear_refusal():
    with pytest.raises(RegistrationRefused, match="401"):
        registrar(Router(), token="wrong").register()


def test_unreachable_router_times_out_with_message():
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    client = httpx.Client(transport=httpx.MockTransport(down))
    reg = Registrar("http://r", INFO, client=client, connect_timeout_s=0.5)
    with pytest.raises(RegistrationRefused, match="unreachable"):
        reg.register()


def test_several_routers_the_worker_fails_over_to_one_that_answers():
    router, down_hosts = Router(), {"r1"}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host in down_hosts:
            raise httpx.ConnectError("refused")
        return router(request)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    reg = Registrar("http://r1, http://r2/", INFO, admin_token="t", client=client,
                    connect_timeout_s=1)
    reg.register()  # r1 is dead: registered through r2
    assert reg.base_url == "http://r2" and "w1" in router.known
    down_hosts.clear()
    reg.heartbeat()  # r1 is back: the worker stays with the router that answered last
    assert reg.base_url == "http://r2" and reg.heartbeats == 1
    down_hosts.add("r2")
    reg.heartbeat()
    assert reg.base_url == "http://r1" and reg.heartbeats == 2
    down_hosts.add("r1")
    with pytest.raises(httpx.ConnectError):
        reg.heartbeat()


def test_namespace_version_is_config_hash(tmp_path):
    (tmp_path / "config.json").write_text('{"a": 1}')
    v1 = model_version(str(tmp_path))
    (tmp_path / "config.json").write_text('{"a": 2}')
    assert model_version(str(tmp_path)) != v1
    assert namespace_for("m", str(tmp_path), "v9") == "m@v9"
