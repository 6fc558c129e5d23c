"""LoRA requests: the adapter a request names, its page keys' namespace, and the router's
handling of ``<model>:<adapter>`` against a real loopback peer."""

from __future__ import annotations

import pytest

from radix_global.keys import lora_extra_key
from router.cli.main import config_from_args
from router.config import ConfigError, config_from_file
from router.keying.lora import (
    ROUTER_LORA_PREFIX,
    ModelRef,
    adapter_extra_key,
    adapters_from_server_info,
    configured_extra_keys,
    parse_lora_paths,
    resolve_model,
)
from router.keying.request_body import GenerateBody


def test_model_names_an_adapter_like_sglang_reads_it():
    served = {"tiny", "s3://bucket/m"}
    assert resolve_model("tiny", served) == ModelRef("tiny", None)
    assert resolve_model("tiny:ad1", served) == ModelRef("tiny", "ad1")
    assert resolve_model("tiny:", served) == ModelRef("tiny", None)
    # a served name with colons is matched whole before splitting
    assert resolve_model("s3://bucket/m", served) == ModelRef("s3://bucket/m", None)
    assert resolve_model("s3://bucket/m:ad", served) == ModelRef("s3://bucket/m", "ad")
    assert resolve_model("other:ad", served) is None
    assert resolve_model("tinyx", served) is None


def _adapter(lora_path: object, from_model: str | None) -> str | None:
    return GenerateBody(text="x", lora_path=lora_path).adapter(from_model)  # type: ignore[arg-type]


def test_adapter_and_its_extra_key():
    assert _adapter("a", "b") == "b"  # the model's suffix wins
    assert _adapter("a", None) == "a"
    assert _adapter(["a", "b"], None) == "a"  # the first prompt's
    assert _adapter([None], None) is None
    assert _adapter("", None) is None
    assert _adapter(None, None) is None
    known = configured_extra_keys({"a": "/adapters/a"})
    assert adapter_extra_key("a", known) == lora_extra_key("a", "/adapters/a")  # SGLang's
    assert adapter_extra_key("b", known) == ROUTER_LORA_PREFIX + "b"
    assert adapter_extra_key(None, known) is None
    assert adapter_extra_key("a", {"a": "reported"}, known) == "reported"  # first map wins


def test_adapters_from_sglang_server_info():
    # SGLang 0.5.23's /server_info (seen from a CPU server with --lora-paths ad1=/tmp/lora/ad1)
    server = {"lora_paths": [{"lora_id": "6fe644d941da5eff9317cf67dff19e25", "lora_name": "ad1",
                              "lora_path": "/tmp/lora/ad1", "pinned": False}]}
    assert adapters_from_server_info(server) == {"ad1": "6fe644d941da5eff9317cf67dff19e25"}
    # ... which is the id keys.lora_extra_key derives from the name and path
    assert lora_extra_key("ad1", "/tmp/lora/ad1") == "6fe644d941da5eff9317cf67dff19e25"
    assert adapters_from_server_info({"lora_paths": ["b=/p/b"]}) == {
        "b": lora_extra_key("b", "/p/b")}
    assert adapters_from_server_info({"lora_paths": {"c": "/p/c"}}) == {
        "c": lora_extra_key("c", "/p/c")}
    for junk in ({}, {"lora_paths": None}, {"lora_paths": [3, "x", {"lora_name": 1}]}):
        assert adapters_from_server_info(junk) == {}


def test_lora_paths_option(tmp_path):
    assert parse_lora_paths(["a=/p/a", "b=/p/b=c"]) == {"a": "/p/a", "b": "/p/b=c"}
    assert parse_lora_paths({"a": "/p/a"}) == {"a": "/p/a"}
    for bad in (["a"], ["=/p"], ["a="], [3], "a=/p", {"a": 1}):
        with pytest.raises(ValueError):
            parse_lora_paths(bad)
    f = tmp_path / "r.toml"
    f.write_text('[router.lora_paths]\nad1 = "/adapters/ad1"\n')
    assert config_from_file(f).keying.lora_paths == {"ad1": "/adapters/ad1"}
    assert config_from_args(["--lora-paths", "x=/p/x", "y=/p/y"]).keying.lora_paths == {
        "x": "/p/x", "y": "/p/y"}
    f.write_text('lora_paths = ["nopath"]\n')
    with pytest.raises(ConfigError, match="NAME=PATH"):
        config_from_file(f)


PROMPT = "hello world the system prompt " * 4


def _prefix(c, body, path="/v1/completions") -> int:
    r = c.post(path, json=body)
    assert r.status_code == 200, r.text
    return int(r.headers["x-radix-prefix-tokens"])


def test_lora_requests_are_routed_and_keyed_apart_from_the_base_model(upstreams,
                                                                      router_factory):
    """A LoRA request never predicts a hit on the base model's pages (SGLang keeps them apart)
    and does predict one on its own adapter's earlier request (routed-prefix memory)."""
    peer, server = upstreams(model="tiny")
    router = router_factory(workers=(server.url,), policy="conductor",
                            lora_paths={"ad1": "/adapters/ad1"})
    router.wait_workers(1)
    with router.client() as c:
        assert _prefix(c, {"model": "tiny", "prompt": PROMPT}) == 0
        assert _prefix(c, {"model": "tiny", "prompt": PROMPT}) > 0  # base after base
        assert _prefix(c, {"model": "tiny:ad1", "prompt": PROMPT}) == 0  # not the base's pages
        assert peer.requests[-1][1]["model"] == "tiny:ad1"  # forwarded as the client sent it
        assert _prefix(c, {"model": "tiny:ad1", "prompt": PROMPT}) > 0  # its own adapter's
        # /generate names the adapter with lora_path; an unconfigured adapter is its own space
        assert _prefix(c, {"text": PROMPT, "lora_path": "ad1"}, "/generate") > 0
        assert _prefix(c, {"text": PROMPT, "lora_path": "ad2"}, "/generate") == 0
        assert _prefix(c, {"text": PROMPT, "lora_path": "ad2"}, "/generate") > 0
        r = c.post("/v1/completions", json={"model": "nope:ad1", "prompt": PROMPT})
        assert r.status_code == 404
    # the embedded index re-keys that adapter's KV events with SGLang's extra key
    assert router.state.index._lora_extra_keys == {"ad1": lora_extra_key("ad1", "/adapters/ad1")}
