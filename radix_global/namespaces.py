"""The namespace a model's workers share: ``"<model>@<version>"`` (``docs/interfaces.md`` s. 1, 2).

One rule for every way a worker joins: the router describing a command-line worker from its
``/server_info`` (``router/cluster/discovery.py``) and the launch wrapper registering one
(``sglang_patch/register.py``). Two rules would put one model in two namespaces, and the router
refuses the second worker (a model already served under another namespace: 409).

- ``<model>`` is the served model name with every ``/`` replaced by ``-``: a namespace prefixes
  the L3 pool's storage keys (``"<namespace>/<digest>"``, ``sglang_patch/storage.py``), whose
  ``/`` separates it from the digest, and a served name is often a hub path (``org/model``).
- ``<version>`` is the first 12 hex digits of SHA-256 over the model folder's ``config.json``
  (over the path when the folder has none; ``"0"`` when no folder is known), unless given: two
  versions of a model never share a tree.

Pure, apart from reading ``config.json``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def model_version(model_path: str | None) -> str:
    """The namespace version of a model folder (see the module docstring)."""
    if not model_path:
        return "0"
    config = Path(model_path) / "config.json"
    data = config.read_bytes() if config.is_file() else model_path.encode()
    return hashlib.sha256(data).hexdigest()[:12]


def namespace_for(model: str, model_path: str | None, version: str | None = None) -> str:
    """``"<model>@<version>"`` for served name ``model``; ``version`` (``--model-version``,
    ``RouterConfig.model_version``) wins over the hash of ``model_path``."""
    return f"{model.replace('/', '-')}@{version or model_version(model_path)}"
