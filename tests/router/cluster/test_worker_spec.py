"""``--workers URL#field=value&...``: command-line workers that cannot describe themselves (vLLM has
no ``/server_info``) get their engine, page size and KV-event endpoint from the URL fragment, and
their model from the OpenAI ``/v1/models`` list (router/cluster/discovery.py)."""

from __future__ import annotations

from typing import Any

import pytest
from http_peer import ServerThread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.cluster.discovery import server_info_from_models, split_worker_spec
from router.config import RouterConfig
from router.state import RouterState


def test_split_worker_spec():
    url, over = split_worker_spec(
        "http://127.0.0.1:8000/#engine=vllm&page_size=128&kv_events_endpoint=ipc:///tmp/a/kv0")
    assert url == "http://127.0.0.1:8000"
    assert over == {"engine": "vllm", "page_size": 128, "kv_events_endpoint": "ipc:///tmp/a/kv0"}
    assert split_worker_spec("http://h:1") == ("http://h:1", {})
    assert split_worker_spec("http://h:1#place=zone-a/rack-3") == (
        "http://h:1", {"place": "zone-a/rack-3"})


@pytest.mark.parametrize("spec", ["http://h:1#bogus=1", "http://h:1#page_size=x",
                                  "http://h:1#engine", "http://h:1#place=rack%203"])
def test_bad_worker_spec_is_refused_at_start(spec: str):
    with pytest.raises(ValueError):
        split_worker_spec(spec)
    with pytest.raises(ValueError):
        # main() turns this into exit status 2
        RouterState(RouterConfig.from_options(workers=(spec,)))


def test_server_info_from_models(tmp_path):
    models = {"data": [{"id": "tiny", "root": str(tmp_path), "max_model_len": 8192}]}
    assert server_info_from_models(models) == {
        "served_model_name": "tiny", "engine": "other", "model_path": str(tmp_path),
        "context_length": 8192}
    # a remote model id is not a folder: no tokenizer path
    assert "model_path" not in server_info_from_models({"data": [{"id": "x", "root": "org/x"}]})
    assert server_info_from_models({"data": []}) == {}
    assert server_info_from_models(["junk"]) == {}


def _openai_only_worker(root: str) -> Starlette:
    """The part of vLLM's HTTP surface discovery uses: no /server_info."""

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": "tiny", "object": "model", "root": root, "max_model_len": 4096}]})

    return Starlette(routes=[Route("/health", health), Route("/v1/models", models)])


def test_cli_worker_without_server_info_joins_with_fragment_fields(router_factory, tokenizer_dir):
    peer = ServerThread(_openai_only_worker(tokenizer_dir)).start()
    try:
        spec = f"{peer.url}#engine=vllm&page_size=128&kv_events_endpoint=ipc:///tmp/rg-none/kv"
        router = router_factory(workers=(spec,))
        router.wait_workers(1)
        entry = router.state.registry.all()[0]
        info: Any = entry.info
        assert (info.url, info.model, info.engine, info.page_size, info.kv_events_endpoint) == (
            peer.url, "tiny", "vllm", 128, "ipc:///tmp/rg-none/kv")
        assert (entry.model_path, entry.context_length) == (tokenizer_dir, 4096)
    finally:
        peer.stop()
