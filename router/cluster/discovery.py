"""Who a command-line worker is, from what it says about itself: the pure half of discovery
(:class:`router.cluster.health.HealthMonitor` does the asking).

A command-line worker (``--workers URL``) is described by its own ``/server_info`` (SGLang):
served model name, model folder (tokenizer), page size, KV-event endpoint, dp size, role. An
engine without ``/server_info`` (vLLM) is described by its OpenAI ``/v1/models`` (served name,
model folder, context length: :func:`server_info_from_models`) and is engine ``other`` unless
told. What the engine cannot say is given in the URL's fragment,
``URL#engine=vllm&page_size=128&kv_events_endpoint=ipc:///PATH`` (:data:`SPEC_FIELDS`; these
override what the worker reports). Its namespace follows the one rule of
``radix_global/namespaces.py``, so it shares a namespace with a registered worker of its model.

No I/O here except reading the model folder's ``config.json`` (namespace version, context
length, KV bytes per token).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlsplit

import msgspec

from radix_global import kv_size
from radix_global.namespaces import namespace_for
from radix_global.registration import WorkerInfo, decode_worker_info
from radix_global.types import Role
from router.keying.tokenize import model_context_length


def cli_worker_id(url: str) -> str:
    """A command-line worker's id: ``host:port`` of its URL (port 80 when none is given)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 80}"


# WorkerInfo fields a --workers URL fragment may set
SPEC_FIELDS = ("engine", "page_size", "kv_events_endpoint", "kv_events_replay_endpoint",
               "kv_events_topic", "compute_domain", "kv_bytes_per_token")
_INT_SPEC_FIELDS = ("page_size", "kv_bytes_per_token")


def split_worker_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``URL[#field=value&...]`` -> (base URL, WorkerInfo overrides); ValueError on a field not
    in :data:`SPEC_FIELDS` or a non-integer ``page_size`` / ``kv_bytes_per_token``."""
    url, _, fragment = spec.partition("#")
    overrides: dict[str, Any] = {}
    for name, value in parse_qsl(fragment, keep_blank_values=True, strict_parsing=bool(fragment)):
        if name not in SPEC_FIELDS:
            raise ValueError(f"worker {url}: unknown field {name!r} after '#' "
                             f"(allowed: {', '.join(SPEC_FIELDS)})")
        if name in _INT_SPEC_FIELDS:
            if not value.isdigit():
                raise ValueError(f"worker {url}: {name} must be an integer, got {value!r}")
            overrides[name] = int(value)
        else:
            overrides[name] = value
    return url.rstrip("/"), overrides


def server_info_from_models(models: Any) -> dict[str, Any]:
    """A ``/server_info``-like dict from an OpenAI ``/v1/models`` answer (vLLM: ``root`` is the
    model folder, ``max_model_len`` the context length); empty if it names no model."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return {}
    first = data[0]
    out: dict[str, Any] = {"served_model_name": first.get("id"), "engine": "other"}
    if isinstance(first.get("root"), str) and Path(first["root"]).is_dir():
        out["model_path"] = first["root"]  # a local folder: the tokenizer lives there
    if isinstance(first.get("max_model_len"), int):
        out["context_length"] = first["max_model_len"]
    return out


def _events_endpoint(raw: Any, worker_url: str) -> str | None:
    """The PUB endpoint from SGLang's ``--kv-events-config``, made connectable (``*`` -> host)."""
    if not raw:
        return None
    try:
        cfg = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (ValueError, TypeError):
        return None
    endpoint = cfg.get("endpoint")
    if not isinstance(endpoint, str):
        return None
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    for wildcard in ("*", "0.0.0.0"):
        endpoint = endpoint.replace(f"//{wildcard}:", f"//{host}:")
    return endpoint


class ModelOverrides(NamedTuple):
    """What the operator says of every command-line worker's model, over what it reports
    (``RouterConfig.model_overrides()``; None: as the worker says)."""

    model_path: str | None = None  # tokenizer/chat-template folder
    served_model_name: str | None = None
    model_version: str | None = None  # namespace version
    page_size: int | None = None
    context_length: int | None = None


def info_from_server_info(url: str, server: dict[str, Any], config: ModelOverrides,
                          overrides: dict[str, Any] | None = None
                          ) -> tuple[WorkerInfo, str | None, int | None]:
    """A registration record for a command-line worker from its ``/server_info`` answer, with
    ``config`` and then ``overrides`` (from :func:`split_worker_spec`, per worker) replacing the
    matching fields; also its model folder and context length (None when unknown).
    ``RegistrationError`` on an override the record refuses."""
    model_path = config.model_path or server.get("tokenizer_path") or server.get("model_path")
    model = config.served_model_name or server.get("served_model_name") or model_path or "default"
    page_size = config.page_size or int(server.get("page_size") or 1)
    mode = server.get("disaggregation_mode") or "null"
    role = {"prefill": Role.PREFILL, "decode": Role.DECODE}.get(mode, Role.MIXED)
    events = _events_endpoint(server.get("kv_events_config"), url)
    topic = "kv-events"
    if isinstance(server.get("kv_events_config"), str):
        with contextlib.suppress(ValueError):
            topic = json.loads(server["kv_events_config"]).get("topic") or topic
    info = WorkerInfo(
        worker_id=cli_worker_id(url), url=url.rstrip("/"), model=str(model),
        namespace=namespace_for(str(model), model_path, config.model_version),
        page_size=page_size, role=role,
        dp_size=int(server.get("dp_size") or 1), engine=str(server.get("engine") or "sglang"),
        kv_events_endpoint=events, kv_events_topic=topic,
        bootstrap_port=_bootstrap_port(server) if role is Role.PREFILL else None,
        # Its KV pool as /server_info reports it, or the model folder when the router has it:
        # without it a fetch would be priced at the router's default (LLaMA3-70B) bytes.
        kv_bytes_per_token=kv_size.for_worker(model_path, server),
    )
    if overrides:
        # through the decoder, so an override is validated like a registration record
        info = decode_worker_info(msgspec.json.encode({**msgspec.structs.asdict(info),
                                                       **overrides}))
    context = config.context_length or server.get("context_length")
    if not isinstance(context, int) and model_path:
        context = model_context_length(model_path)
    return info, model_path, context if isinstance(context, int) else None


def _bootstrap_port(server: dict[str, Any]) -> int | None:
    port = server.get("disaggregation_bootstrap_port")
    return port if isinstance(port, int) else None
