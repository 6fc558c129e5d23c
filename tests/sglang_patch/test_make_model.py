"""make-model: tokenizer agrees with the synthetic vocabulary; the model does not collapse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radix_global import trace
from sglang_patch import make_model as mm

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mm.make_model(tmp_path_factory.mktemp("m") / "tiny-llama")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def model(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def test_vocabulary_places_synthetic_words_by_construction() -> None:
    vocab = mm.vocabulary()
    assert len(vocab) == 8192 == len(set(vocab.values()))
    assert vocab[trace.synthetic_word(0)] == trace.SYNTHETIC_FIRST_ID
    last = trace.SYNTHETIC_SIZE - 1
    assert vocab[trace.synthetic_word(last)] == trace.SYNTHETIC_FIRST_ID + last == 8191


def test_saved_tokenizer_round_trips_synthetic_text(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = trace.synthesize_prompt([7, 8, 9], 1500, 64)
    text = trace.prompt_text(ids, tokenizer)
    assert tokenizer.encode(text, add_special_tokens=False) == ids
    decoded = tokenizer.decode(ids)
    assert decoded == text and tokenizer.encode(decoded, add_special_tokens=False) == ids
    # No implicit BOS: an engine tokenizing the text sees exactly the router's ids.
    assert tokenizer.encode(text) == ids
    # Any ASCII text tokenizes without <unk>.
    assert tokenizer.unk_token_id not in tokenizer.encode("Hello, world! {x: 1}")


def test_chat_template_and_special_tokens(tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "w0001 w0002"}],
                                         tokenize=False, add_generation_prompt=True)
    assert text == "<s><|user|> w0001 w0002 <|end|> <|assistant|> "
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == tokenizer.bos_token_id == 1 and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token_id == 0
    assert ids[2:4] == [trace.SYNTHETIC_FIRST_ID + 1, trace.SYNTHETIC_FIRST_ID + 2]


def test_config_size_and_stamp(model_dir: Path, model) -> None:  # type: ignore[no-untyped-def]
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["max_position_embeddings"] >= 8192 and cfg["vocab_size"] == 8192
    params = mm.param_count(model)
    assert 10_000_000 <= params <= 30_000_000
    stamp = json.loads((model_dir / mm.STAMP_FILE).read_text())
    assert stamp["params"] == params and stamp["recipe_hash"] == mm.DEFAULT_RECIPE.digest()


def _greedy(model, ids: list[int], n: int = 8) -> list[int]:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


def test_greedy_outputs_differ_and_do_not_collapse(model) -> None:  # type: ignore[no-untyped-def]
    prompts = [trace.synthesize_prompt([h, h + 1], 512, 32) for h in (10, 20, 30)]
    outs = [_greedy(model, p) for p in prompts]
    assert len({tuple(o) for o in outs}) == len(outs), outs
    for out in outs:
        assert len(set(out)) > 2, f"collapsed to a repeated token: {out}"


def test_output_depends_on_early_prefix(model) -> None:  # type: ignore[no-untyped-def]
    # A wrong cached prefix must be visible in the output: change token 3 of a 64-token prompt.
    prompt = trace.synthesize_prompt([41, 42], 512, 32)
    changed = list(prompt)
    changed[3] = trace.SYNTHETIC_FIRST_ID + (changed[3] + 1 - trace.SYNTHETIC_FIRST_ID) % 7992
    assert _greedy(model, prompt) != _greedy(model, changed)


def test_make_model_is_idempotent_and_deterministic(model_dir: Path, tmp_path: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    assert mm.make_model(model_dir) == model_dir
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before
    other = tmp_path / "again"
    assert mm.main([str(other)]) == 0
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (other / name).read_bytes() == (model_dir / name).read_bytes()


def test_fresh_build_is_bitwise_deterministic() -> None:
    recipe = mm.ModelRecipe(hidden_size=64, num_hidden_layers=1, intermediate_size=64,
                            num_attention_heads=2, num_key_value_heads=1)
    a = mm.build_model(recipe, 8192).state_dict()
    b = mm.build_model(recipe, 8192).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ensure_model_leaves_any_model_alone(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # some other model: not ours, not replaced
    assert mm.ensure_model(tmp_path) == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_ensure_model_makes_the_tiny_one_where_none_is(model_dir: Path, tmp_path: Path) -> None:
    made = mm.ensure_model(tmp_path / "m")
    assert json.loads((made / mm.STAMP_FILE).read_text()) == json.loads(
        (model_dir / mm.STAMP_FILE).read_text())
