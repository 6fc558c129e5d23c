"""An upstream that answers every request at once, for ``benchmarks/micro/router_overhead.py``.

A raw ASGI app under uvicorn: canned SGLang-shaped answers for ``/generate``,
``/v1/completions``, ``/server_info`` and the model-info routes (what a router asks a worker at
registration), so a router in front of it can be timed without engine noise.

Run: ``python -m benchmarks.harness.instant_upstream --port P --model-path DIR`` (loopback only).
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def upstream_app(model_path: str) -> Any:
    info = json.dumps({"served_model_name": "tiny", "model_path": model_path,
                       "tokenizer_path": model_path, "page_size": 16, "dp_size": 1,
                       "context_length": 8192}).encode()
    gen = json.dumps({"text": "ok", "meta_info": {"cached_tokens": 0, "prompt_tokens": 1,
                                                  "completion_tokens": 1}}).encode()
    cmpl = json.dumps({"id": "c", "object": "text_completion", "model": "tiny",
                       "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                 "total_tokens": 2}}).encode()
    models = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
    model_info = json.dumps({"model_path": model_path, "tokenizer_path": model_path,
                             "is_generation": True}).encode()
    by_path = {"/generate": gen, "/v1/completions": cmpl, "/server_info": info,
               "/get_server_info": info, "/v1/models": models, "/get_model_info": model_info,
               "/model_info": model_info}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # drain the request body
            message = await receive()
            more = message.get("more_body", False)
        body = by_path.get(scope["path"], b"{}")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def serve_upstream(port: int, model_path: str) -> None:
    import uvicorn

    uvicorn.run(upstream_app(model_path), host="127.0.0.1", port=port, log_level="warning",
                access_log=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-path", required=True)
    args = p.parse_args(argv)
    serve_upstream(args.port, args.model_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
