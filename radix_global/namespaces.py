"""The namespace a model's workers share: ``"<model>@<version>"`` (``docs/interfaces.md``,
"Identities" and "Worker registration").

One rule for every way a worker joins: the router describing a command-line worker from its
``/server_info`` (``router/cluster/discovery.py``) and the launch wrapper registering one
(``sglang_patch/register.py``). Two rules would put one model in two namespaces, and the router
refuses the second worker (a model already served under another namespace: 409).

- ``<model>`` is the served model name with every ``/`` replaced by ``-``: a namespace prefixes
  the L3 pool's storage keys (``"<namespace>/<digest>"``, ``sglang_patch/storage.py``), whose
  ``/`` separates it from the digest, and a served name is often a hub path (``org/model``).
- ``<version>`` is the model's identity (``docs/interfaces.md``, "Model identity"), unless given:
  the first 12 hex digits of SHA-256 over the folder's ``config.json`` (over the path when the
  folder has none; ``"0"`` when no folder is known), its tokenizer files and a sample of every
  weight file, so two versions of a model (same config, other weights) never share a tree or pool
  pages.

Pure, apart from reading the model folder (a few hundred KiB, whatever the weights' size).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                   "chat_template.jinja", "chat_template.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
HEAD_BYTES = 64 * 1024  # a safetensors header (tensor names, dtypes, shapes) fits in it
SAMPLE_BLOCKS, BLOCK_BYTES = 16, 4096


def model_version(model_path: str | None) -> str:
    """The namespace version of a model folder (see the module docstring)."""
    if not model_path:
        return "0"
    folder = Path(model_path)
    config = folder / "config.json"
    digest = hashlib.sha256(config.read_bytes() if config.is_file() else model_path.encode())
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
    weights = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES
                     ) if folder.is_dir() else []
    for path in weights:
        _sample_into(digest, path)
    return digest.hexdigest()[:12]


def _sample_into(digest: hashlib._Hash, path: Path) -> None:
    """Name, size, head and ``SAMPLE_BLOCKS`` spread blocks of one weight file."""
    size = path.stat().st_size
    digest.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as f:
        digest.update(f.read(HEAD_BYTES))
        last = max(0, size - BLOCK_BYTES)
        for k in range(SAMPLE_BLOCKS):
            f.seek(last * k // (SAMPLE_BLOCKS - 1))
            digest.update(f.read(BLOCK_BYTES))


def namespace_for(model: str, model_path: str | None, version: str | None = None) -> str:
    """``"<model>@<version>"`` for served name ``model``; ``version`` (``--model-version``,
    ``RouterConfig.model_version``) wins over the hash of ``model_path``."""
    return f"{model.replace('/', '-')}@{version or model_version(model_path)}"
