"""Fixtures for router tests: a tiny tokenizer folder, peer workers and a running router."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_peer import ServerThread, Upstream

from router.config import RouterConfig
from router.http.app import build_app
from router.state import RouterState

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A word-level tokenizer with a chat template and a model config, saved like a model."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = [f"w{i}" for i in range(200)] + ["hello", "world", "the", "system", "prompt"]
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator([" ".join(words)] * 2, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    config = {"max_position_embeddings": 512, "vocab_size": 300}
    (Path(path) / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture
def upstreams(tokenizer_dir: str) -> Iterator[Callable[..., tuple[Upstream, ServerThread]]]:
    started: list[ServerThread] = []

    def start(**kw: Any) -> tuple[Upstream, ServerThread]:
        peer = Upstream(model_path=tokenizer_dir, **kw)
        server = ServerThread(peer.app).start()
        started.append(server)
        return peer, server

    yield start
    for server in started:
        server.stop()


class RunningRouter:
    def __init__(self, state: RouterState, server: ServerThread) -> None:
        self.state, self.server, self.url = state, server, server.url

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kw)

    def wait_workers(self, n: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while len(self.state.registry) != n:
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {n} workers, have {len(self.state.registry)}")
            time.sleep(0.05)
        for e in self.state.registry.all():  # the tokenizer loads in the background
            if e.model_path:
                tok = self.state.tokenizers.get(e.model_path)
                tok.load()


@pytest.fixture
def router_factory() -> Iterator[Callable[..., RunningRouter]]:
    started: list[ServerThread] = []

    def start(**options: Any) -> RunningRouter:
        options.setdefault("health_check_interval_s", 0.2)
        options.setdefault("policy", "round_robin")
        options.setdefault("profile_max_tokens", 0)  # peers count requests: no profiling calls
        state = RouterState(RouterConfig.from_options(**options))
        server = ServerThread(build_app(state), router=True).start()
        started.append(server)
        return RunningRouter(state, server)

    yield start
    for server in started:
        server.stop()
