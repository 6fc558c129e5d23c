"""What a worker reports of itself in ``/server_info`` is checked before the router uses it
(router/cluster/discovery.py ``check_server_info``; issue 35 item 7): a page size, context length
or dp size that is not an integer in its bounds, or a name that is not a string, refuses the
worker (:class:`ServerInfoError`) instead of crashing discovery or turning a limit off. The
admin path (400) is tested in tests/router/http/test_hostile.py."""

from __future__ import annotations

import json
import logging

import pytest

from radix_global.registration import MAX_CONTEXT_LENGTH, MAX_PAGE_SIZE, RegistrationError
from router.cluster.discovery import (
    ModelOverrides,
    ServerInfoError,
    check_server_info,
    info_from_server_info,
)

URL = "http://127.0.0.1:30001"
SANE = {"served_model_name": "tiny", "page_size": 16, "context_length": 4096, "dp_size": 2,
        "kv_events_config": json.dumps({"endpoint": "tcp://*:5557", "topic": "t"}),
        "disaggregation_mode": "null"}


def test_a_sane_answer_is_described_as_before():
    info, path, context = info_from_server_info(URL, SANE, ModelOverrides())
    assert (info.page_size, info.dp_size, context, path) == (16, 2, 4096, None)
    assert info.kv_events_endpoint == "tcp://127.0.0.1:5557" and info.kv_events_topic == "t"
    bare, _, context = info_from_server_info(URL, {}, ModelOverrides())
    assert (bare.page_size, bare.dp_size, context) == (1, 1, None)  # absent: the defaults


@pytest.mark.parametrize(("config", "endpoint"), [
    ({"endpoint": "tcp://127.0.0.1:5557", "bind": True}, "tcp://127.0.0.1:5557"),
    ({"endpoint": "tcp://0.0.0.0:5557"}, "tcp://127.0.0.1:5557"),
    # SGLang's publisher connects to a concrete address unless told to bind: nothing to hear
    ({"endpoint": "tcp://127.0.0.1:5557"}, None),
    ({"endpoint": "tcp://*:5557", "bind": False}, None),
])
def test_a_publisher_that_connects_instead_of_binding_is_named_not_subscribed(
        config, endpoint, caplog):  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.WARNING, logger="router.cluster.discovery"):
        info, _, _ = info_from_server_info(URL, {**SANE, "kv_events_config": config},
                                           ModelOverrides())
    assert info.kv_events_endpoint == endpoint
    assert ('"bind": true' in caplog.text) == (endpoint is None)


@pytest.mark.parametrize(("field", "value"), [
    ("page_size", "16"), ("page_size", 1e9), ("page_size", 10**9), ("page_size", 0),
    ("page_size", True), ("page_size", MAX_PAGE_SIZE + 1),
    ("context_length", 10**12), ("context_length", 1e12), ("context_length", -1),
    ("context_length", MAX_CONTEXT_LENGTH + 1), ("context_length", "4096"),
    ("dp_size", "two"), ("dp_size", 10**6),
    ("served_model_name", ["x"]), ("model_path", {"a": 1}), ("engine", 5),
    ("disaggregation_mode", ["prefill"]),
    ("kv_events_config", "not json"), ("kv_events_config", "[1]"),
    ("kv_events_config", {"endpoint": 5}), ("kv_events_config", '{"topic": ["t"]}'),
    ("internal_states", [{"memory_usage": {"kvcache": float("inf"), "token_capacity": 10}}]),
])
def test_an_unusable_report_is_a_typed_refusal_naming_the_field(field, value):
    with pytest.raises(ServerInfoError, match=field.split("_states")[0]) as exc:
        info_from_server_info(URL, {**SANE, field: value}, ModelOverrides())
    assert isinstance(exc.value, RegistrationError)  # what discovery logs and skips


def test_the_bounds_are_inclusive():
    report = check_server_info({"page_size": MAX_PAGE_SIZE, "context_length": MAX_CONTEXT_LENGTH})
    assert (report.page_size, report.context_length) == (MAX_PAGE_SIZE, MAX_CONTEXT_LENGTH)


@pytest.mark.parametrize("report", [{"page_size": "abc"}, {"page_size": 1e9},
                                    {"context_length": 10**12}])
def test_command_line_discovery_logs_and_skips_such_a_worker(
        upstreams, router_factory, tokenizer_dir, caplog, report):
    """At start (``RouterState.start`` discovers every --workers URL) a string page size made
    the router fail to start; now the worker is skipped with an error in the log, and a sane
    worker beside it joins."""
    _, good = upstreams()
    lying, liar = upstreams()
    lying.report = report
    with caplog.at_level(logging.ERROR, "radix_global.router.cluster.health"):
        router = router_factory(workers=(liar.url, good.url))
        router.wait_workers(1)
        with router.client() as c:
            assert c.get("/health").status_code == 200
            workers = c.get("/admin/workers").json()["workers"]
    assert [w["url"] for w in workers] == [good.url]
    field = next(iter(report))
    assert any(field in r.getMessage() and liar.url in r.getMessage()
               for r in caplog.records), caplog.text

