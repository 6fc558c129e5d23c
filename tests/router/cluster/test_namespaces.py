"""One namespace rule (radix_global/namespaces.py) for both ways a worker joins: a command-line
worker described by its ``/server_info`` (router/cluster/discovery.py) and a worker the launch
wrapper registers (sglang_patch/register.py ``namespace_for``). A served name with a slash used to
get ``org-tiny@v`` from the first and ``org/tiny@v`` from the second, and the registry refused the
second worker of the model (409)."""

from __future__ import annotations

from pathlib import Path

from radix_global.namespaces import model_version, namespace_for
from radix_global.registration import WorkerInfo
from router.cluster.discovery import ModelOverrides, info_from_server_info
from router.cluster.registry import Source, WorkerRegistry
from sglang_patch import register

MODEL = "org/tiny"


def _model_dir(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    return str(tmp_path)


def test_cli_and_registered_workers_of_a_slashed_model_share_a_namespace(tmp_path: Path) -> None:
    path = _model_dir(tmp_path)
    cli, _, _ = info_from_server_info(
        "http://127.0.0.1:30001", {"served_model_name": MODEL, "model_path": path,
                                   "page_size": 4}, ModelOverrides())
    # what the launch wrapper (sglang_patch/launch_server.py ``run``) registers by default
    registered_ns = register.namespace_for(MODEL, path)
    assert cli.namespace == registered_ns == f"org-tiny@{model_version(path)}"

    registry = WorkerRegistry()
    registry.add(cli, Source.CLI, 0.0)
    registered = WorkerInfo(worker_id="sgl-1", url="http://127.0.0.1:30002", model=MODEL,
                            namespace=registered_ns, page_size=4)
    registry.add(registered, Source.REGISTERED, 0.0)  # no ConflictError: one namespace
    assert registry.models() == {MODEL: registered_ns}


def test_namespace_version_rule(tmp_path: Path) -> None:
    path = _model_dir(tmp_path)
    assert namespace_for(MODEL, path, "v9") == "org-tiny@v9"  # a given version wins
    assert namespace_for("tiny", None) == "tiny@0"  # no folder known
    assert model_version(str(tmp_path / "absent")) == model_version(str(tmp_path / "absent"))
    before = model_version(path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen"}')
    assert model_version(path) != before  # another model version: another tree


def test_the_version_is_the_models_identity_weights_and_tokenizer_included(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """Same config.json, other weights (a retrained checkpoint): another version, so its pages
    never load for the other model (docs/interfaces.md, "Model identity"). A byte-identical copy
    elsewhere is the same model: the same version."""
    import dataclasses
    import shutil

    from sglang_patch.make_model import DEFAULT_RECIPE, make_model

    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    assert model_version(str(copy)) == model_version(str(tiny_model_dir))
    retrained = make_model(tmp_path / "retrained",
                           dataclasses.replace(DEFAULT_RECIPE, seed=DEFAULT_RECIPE.seed + 1))
    assert (retrained / "config.json").read_bytes() == (copy / "config.json").read_bytes()
    assert model_version(str(retrained)) != model_version(str(copy))
    tok = copy / "tokenizer_config.json"
    before = model_version(str(copy))
    tok.write_text(tok.read_text().replace("}", ', "x": 1}', 1))
    assert model_version(str(copy)) != before
