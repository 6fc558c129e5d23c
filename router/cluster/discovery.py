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

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NamedTuple
from urllib.parse import parse_qsl, urlsplit

import msgspec

from radix_global import kv_size
from radix_global.namespaces import namespace_for
from radix_global.options import opt
from radix_global.registration import (
    MAX_CONTEXT_LENGTH,
    MAX_DP_SIZE,
    MAX_PAGE_SIZE,
    RegistrationError,
    WorkerInfo,
    check_place,
    decode_worker_info,
)
from radix_global.types import Role
from router.keying.tokenize import model_context_length

log = logging.getLogger(__name__)


def cli_worker_id(url: str) -> str:
    """A command-line worker's id: ``host:port`` of its URL (port 80 when none is given)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 80}"


# WorkerInfo fields a --workers URL fragment may set
SPEC_FIELDS = ("engine", "page_size", "kv_events_endpoint", "kv_events_replay_endpoint",
               "kv_events_topic", "compute_domain", "kv_bytes_per_token", "place")
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
        elif name == "place":
            try:
                check_place(value)
            except RegistrationError as exc:
                raise ValueError(f"worker {url}: {exc}") from exc
            overrides[name] = value
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


class ServerInfoError(RegistrationError):
    """A worker's ``/server_info`` (or ``/v1/models``) answer reports a value the router cannot
    use: a non-integer or out-of-range ``page_size``, ``context_length`` or ``dp_size``, a
    non-string name or path. The worker is refused (HTTP 400 on the admin path, logged and
    skipped by command-line discovery), never half-registered with a 500."""


class ServerReport(NamedTuple):
    """What a worker says of itself, checked: each field its type and bounds, or None when the
    worker does not say (a field it reports wrongly is a :class:`ServerInfoError`)."""

    served_model_name: str | None
    model_path: str | None  # ``tokenizer_path``, else ``model_path``
    page_size: int | None
    context_length: int | None
    dp_size: int | None
    engine: str | None
    disaggregation_mode: str | None
    bootstrap_port: int | None
    kv_events: dict[str, Any] | None  # the parsed ``kv_events_config``


def _bad(name: str, want: str, value: Any) -> ServerInfoError:
    shown = repr(value)
    return ServerInfoError(f"/server_info reports {name} = "
                           f"{shown if len(shown) <= 60 else shown[:57] + '...'}: {want}")


def _int_field(server: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    """An integer in [low, high], or None when absent. A float (JSON ``1e9``), a string or a
    bool is refused: each would otherwise reach ``int()`` or a comparison and fail later, or
    silently change the router's limits."""
    value = server.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _bad(name, f"must be an integer in [{low}, {high}]", value)
    return value


def _str_field(server: Mapping[str, Any], name: str) -> str | None:
    value = server.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _bad(name, "must be a string", value)
    return value


def _kv_events(raw: Any) -> dict[str, Any] | None:
    """SGLang's ``kv_events_config`` (a JSON string of an object, or the object), with its
    ``endpoint`` and ``topic`` strings when given."""
    if raw is None or raw == "":
        return None
    try:
        cfg = json.loads(raw) if isinstance(raw, str) else raw
    except (ValueError, RecursionError):
        cfg = None
    if not isinstance(cfg, dict):
        raise _bad("kv_events_config", "must be a JSON object", raw)
    for name in ("endpoint", "topic"):
        if cfg.get(name) is not None and not isinstance(cfg[name], str):
            raise _bad(f"kv_events_config.{name}", "must be a string", cfg[name])
    return cfg


def check_server_info(server: Mapping[str, Any]) -> ServerReport:
    """Every field of a ``/server_info`` answer the router uses, checked against the bounds a
    registration record has (``radix_global/registration.py``); :class:`ServerInfoError` names
    the first bad one."""
    port = server.get("disaggregation_bootstrap_port")
    return ServerReport(
        served_model_name=_str_field(server, "served_model_name"),
        model_path=_str_field(server, "tokenizer_path") or _str_field(server, "model_path"),
        page_size=_int_field(server, "page_size", 1, MAX_PAGE_SIZE),
        context_length=_int_field(server, "context_length", 1, MAX_CONTEXT_LENGTH),
        dp_size=_int_field(server, "dp_size", 1, MAX_DP_SIZE),
        engine=_str_field(server, "engine"),
        disaggregation_mode=_str_field(server, "disaggregation_mode"),
        # an optional extra (another engine may report anything there): a port or nothing
        bootstrap_port=port if isinstance(port, int) and not isinstance(port, bool)
        and 0 < port < 65536 else None,
        kv_events=_kv_events(server.get("kv_events_config")),
    )


_WILDCARD_HOSTS = ("*", "0.0.0.0", "::")


def _events_endpoint(cfg: Mapping[str, Any] | None, worker_url: str) -> str | None:
    """The PUB endpoint from SGLang's ``--kv-events-config``, made connectable (``*`` -> host).
    None (logged) when the publisher connects instead of binding: SGLang binds only with
    ``"bind": true`` or a wildcard host, and the router's subscriber connects too, so not one
    event would arrive."""
    endpoint = cfg.get("endpoint") if cfg else None
    if not cfg or not endpoint:
        return None
    bind = cfg.get("bind")
    host = endpoint.split("//", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if bind is False or (bind is None and host not in _WILDCARD_HOSTS):
        log.warning("worker %s: its --kv-events-config publisher connects to %s instead of "
                    "binding it, so the router receives no KV events from it (routing is "
                    "cache-blind there): add \"bind\": true, or use tcp://*:PORT",
                    worker_url, endpoint)
        return None
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    for wildcard in ("*", "0.0.0.0"):
        endpoint = endpoint.replace(f"//{wildcard}:", f"//{host}:")
    return endpoint


@dataclass(frozen=True)
class ModelOverrides:
    """Models of command-line workers: these override what each worker's /server_info says.

    ``RouterConfig.models``; unset: as the worker says."""

    model_path: Annotated[str | None, opt(
        "tokenizer/chat template folder of command-line workers")] = None
    served_model_name: Annotated[str | None, opt(
        "model name of command-line workers (default: theirs)")] = None
    model_version: Annotated[str | None, opt(
        "namespace version (default: hash of the model's config.json)")] = None
    page_size: Annotated[int | None, opt(
        "tokens per KV page (default: the worker's)", ge=1)] = None
    context_length: Annotated[int | None, opt(
        "prompt limit in tokens (default: the model's)", ge=1)] = None


def model_of_server(report: ServerReport, config: ModelOverrides) -> tuple[str | None, int | None]:
    """A worker's model folder (tokenizer) and context length: ``config`` first, then what the
    worker reported (checked), then the folder's ``config.json``; None when unknown."""
    model_path = config.model_path or report.model_path
    context = config.context_length or report.context_length
    if context is None and model_path:
        context = model_context_length(model_path)
    return model_path, context


def info_from_server_info(url: str, server: Mapping[str, Any], config: ModelOverrides,
                          overrides: dict[str, Any] | None = None
                          ) -> tuple[WorkerInfo, str | None, int | None]:
    """A registration record for a command-line worker from its ``/server_info`` answer, with
    ``config`` and then ``overrides`` (from :func:`split_worker_spec`, per worker) replacing the
    matching fields; also its model folder and context length (None when unknown).
    ``RegistrationError`` on an override the record refuses, :class:`ServerInfoError` (one) on
    a value the worker reports that the router cannot use."""
    report = check_server_info(server)
    model_path, context = model_of_server(report, config)
    model = config.served_model_name or report.served_model_name or model_path or "default"
    page_size = config.page_size or report.page_size or 1
    mode = report.disaggregation_mode or "null"
    role = {"prefill": Role.PREFILL, "decode": Role.DECODE}.get(mode, Role.MIXED)
    events = _events_endpoint(report.kv_events, url)
    topic = (report.kv_events or {}).get("topic") or "kv-events"
    try:
        # Its KV pool as /server_info reports it, or the model folder when the router has it:
        # without it a fetch would be priced at the router's default (LLaMA3-70B) bytes.
        kv_bytes = kv_size.for_worker(model_path, server)
    except (ArithmeticError, ValueError) as exc:  # an infinite or NaN ``kvcache`` size
        raise _bad("internal_states[0].memory_usage", f"unusable ({exc})",
                   server.get("internal_states")) from exc
    info = WorkerInfo(
        worker_id=cli_worker_id(url), url=url.rstrip("/"), model=str(model),
        namespace=namespace_for(str(model), model_path, config.model_version),
        page_size=page_size, role=role,
        dp_size=report.dp_size or 1, engine=report.engine or "sglang",
        kv_events_endpoint=events, kv_events_topic=topic,
        bootstrap_port=report.bootstrap_port if role is Role.PREFILL else None,
        kv_bytes_per_token=kv_bytes,
    )
    if overrides:
        # through the decoder, so an override is validated like a registration record
        info = decode_worker_info(msgspec.json.encode({**msgspec.structs.asdict(info),
                                                       **overrides}))
    return info, model_path, context
