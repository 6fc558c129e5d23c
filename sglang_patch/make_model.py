"""``radix-global make-model DIR``: the offline tiny Llama + tokenizer for tests and benchmarks.

No model hub is reachable, so the model is built locally and deterministically:

- Tokenizer: a ``tokenizers`` WordPiece model wrapped in ``PreTrainedTokenizerFast``. Vocabulary
  (8,192 ids): special tokens, printable ASCII characters (and their ``##`` continuations, so any
  ASCII text tokenizes without ``<unk>``), then the synthetic words ``w0000 ...`` of
  ``radix_global.trace`` at ids ``SYNTHETIC_FIRST_ID ...``: text made of those words separated by
  spaces re-tokenizes to exactly those ids (WordPiece takes the longest whole-word match). No BOS
  is added automatically (the chat template writes it), so an engine tokenizing a synthetic text
  sees exactly the ids the router computed.
- Model: ``LlamaConfig`` hidden 384, 6 layers, 6 heads (2 KV heads), MLP 1024, 8,192 vocab,
  8,192 positions, float32: ~15.9M parameters, so prefill of a few thousand tokens dominates the
  cost of a request on CPU. Weights are a seeded random init with the embedding and the
  query/key projections scaled up: the default init (std 0.02) gives near-uniform attention and
  greedy decoding collapses to one repeated token; with sharp, content-dependent attention the
  greedy output differs from prompt to prompt and depends on the whole prefix (so a corrupted
  cached prefix would change the output). No training needed: the build takes seconds.
- Idempotent: the build is keyed by a hash of the recipe and cached under
  ``~/.cache/radix-global/models/<hash>`` (``RADIX_GLOBAL_CACHE`` overrides the root); DIR gets a
  copy (hard links when possible). A DIR already holding the same recipe is left alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from radix_global.trace import SYNTHETIC_FIRST_ID, SYNTHETIC_SIZE, synthetic_word

STAMP_FILE = "radix_global_model.json"
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>",
                  "<|end|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


@dataclass(frozen=True)
class ModelRecipe:
    """Everything that determines the built files; its hash names the cache entry."""

    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    intermediate_size: int = 1024
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0
    seed: int = 20251129
    init_std: float = 0.02
    embedding_std: float = 1.0
    qk_std: float = 0.3
    model_name: str = "tiny-llama"
    version: int = 1

    def digest(self) -> str:
        payload = json.dumps({**asdict(self), "first": SYNTHETIC_FIRST_ID,
                              "size": SYNTHETIC_SIZE}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


DEFAULT_RECIPE = ModelRecipe()


def vocabulary() -> dict[str, int]:
    """Token -> id; synthetic word i is at ``SYNTHETIC_FIRST_ID + i`` by construction."""
    vocab: dict[str, int] = {}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    chars = [chr(c) for c in range(33, 127)]
    for ch in chars:
        vocab[ch] = len(vocab)
    for ch in chars:
        vocab["##" + ch] = len(vocab)
    reserved = 0
    while len(vocab) < SYNTHETIC_FIRST_ID:
        vocab[f"<|reserved_{reserved}|>"] = len(vocab)
        reserved += 1
    if len(vocab) != SYNTHETIC_FIRST_ID:
        raise AssertionError("special + character tokens overflow SYNTHETIC_FIRST_ID")
    for i in range(SYNTHETIC_SIZE):
        vocab[synthetic_word(i)] = SYNTHETIC_FIRST_ID + i
    return vocab


def build_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` over ``vocabulary()``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordPiece(vocabulary(), unk_token="<unk>", max_input_chars_per_word=64))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", chat_template=CHAT_TEMPLATE, model_max_length=8192,
        clean_up_tokenization_spaces=False,
    )


def build_model(recipe: ModelRecipe, vocab_size: int) -> Any:
    """Seeded random init with sharpened attention (see the module doc for why)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        rope_parameters={"rope_theta": recipe.rope_theta, "rope_type": "default"},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        dtype="float32",
    )
    torch.manual_seed(recipe.seed)
    model: Any = LlamaForCausalLM(config)
    model = model.to(torch.float32)
    gen = torch.Generator().manual_seed(recipe.seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            std = recipe.init_std
            if "embed_tokens" in name:
                std = recipe.embedding_std
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                std = recipe.qk_std
            param.copy_(torch.randn(param.shape, generator=gen) * std)
    model.eval()
    return model


def param_count(model: Any) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def _cache_root() -> Path:
    root = os.environ.get("RADIX_GLOBAL_CACHE") or Path.home() / ".cache" / "radix-global"
    return Path(root) / "models"


def _read_stamp(path: Path) -> dict[str, Any] | None:
    try:
        stamp = json.loads((path / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _build_into(path: Path, recipe: ModelRecipe) -> None:
    tokenizer = build_tokenizer()
    model = build_model(recipe, len(tokenizer))
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    stamp = {"recipe": asdict(recipe), "recipe_hash": recipe.digest(),
             "params": param_count(model), "synthetic_first_id": SYNTHETIC_FIRST_ID,
             "synthetic_size": SYNTHETIC_SIZE}
    (path / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True))


def cached_model(recipe: ModelRecipe = DEFAULT_RECIPE) -> Path:
    """The cache entry for ``recipe``, built on first use (atomic rename: safe across processes)."""
    entry = _cache_root() / recipe.digest()
    if (_read_stamp(entry) or {}).get("recipe_hash") == recipe.digest():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        _build_into(tmp, recipe)
        tmp.chmod(0o755)
        try:
            tmp.rename(entry)
        except OSError:  # another process won the race; its entry is equivalent
            if (_read_stamp(entry) or {}).get("recipe_hash") != recipe.digest():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def make_model(target: str | os.PathLike[str], recipe: ModelRecipe = DEFAULT_RECIPE) -> Path:
    """Ensure ``target`` holds the model of ``recipe``; returns ``target`` as a Path."""
    dest = Path(target)
    if (_read_stamp(dest) or {}).get("recipe_hash") == recipe.digest():
        return dest
    source = cached_model(recipe)
    dest.mkdir(parents=True, exist_ok=True)
    for item in sorted(source.iterdir()):
        if item.name == STAMP_FILE:
            continue
        out = dest / item.name
        if out.exists():
            out.unlink()
        try:
            os.link(item, out)
        except OSError:
            shutil.copy2(item, out)
    (dest / STAMP_FILE).unlink(missing_ok=True)
    shutil.copy2(source / STAMP_FILE, dest / STAMP_FILE)  # last: marks the copy complete
    return dest


def ensure_model(target: str | os.PathLike[str]) -> Path:
    """``target`` left alone when it holds a model (a ``config.json``: ours or any other), else
    the tiny model made there (:func:`make_model`); what the cluster harness and benchmarks run."""
    dest = Path(target)
    return dest if (dest / "config.json").exists() else make_model(dest)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radix-global make-model", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", help="folder to hold the model (created; left alone if current)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    path = make_model(args.dir)
    stamp = _read_stamp(path) or {}
    print(f"{path}: tiny Llama, {stamp.get('params', '?'):,} params, "
          f"recipe {stamp.get('recipe_hash')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
