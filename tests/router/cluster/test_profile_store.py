"""Fitted prefill profiles across router restarts (router/cluster/profile_store.py, issue 16)."""

from __future__ import annotations

import json

import pytest

from radix_global.registration import WorkerInfo
from router.cluster.profile_store import ProfileStore
from router.cluster.registry import Source
from router.config import RouterConfig
from router.routing.prefill_model import PrefillModel
from router.state import RouterState

COEF = (0.02, 0.4, 0.003, 0.05)


def info(wid: str = "w0", namespace: str = "tiny@1") -> WorkerInfo:
    return WorkerInfo(worker_id=wid, url="http://127.0.0.1:9", model="tiny", namespace=namespace,
                      page_size=4)


def test_saved_profiles_survive_a_reopen_per_worker_and_namespace(tmp_path):
    path = tmp_path / "profiles.json"
    ProfileStore(path).put("w0", "tiny@1", COEF)
    store = ProfileStore(path)
    assert store.get("w0", "tiny@1") == COEF
    assert store.get("w0", "tiny@2") is None  # another model since: not this profile
    assert store.get("w1", "tiny@1") is None


@pytest.mark.parametrize("text", ["{nope", "[]", '{"version": 2, "profiles": {}}',
                                  '{"version": 1, "profiles": {"w0": {"namespace": "tiny@1", '
                                  '"coef": [1, 2, "x", 4]}}}'])
def test_a_bad_file_is_an_empty_store_not_a_failed_start(tmp_path, text):
    path = tmp_path / "profiles.json"
    path.write_text(text)
    assert ProfileStore(path).get("w0", "tiny@1") is None


def test_a_restarted_router_prices_a_returning_worker_with_its_saved_profile(tmp_path):
    path = tmp_path / "profiles.json"
    ProfileStore(path).put("w0", "tiny@1", COEF)
    state = RouterState(RouterConfig.from_options(profiles_file=str(path), profile_max_tokens=1024))
    state.registry.add(info(), Source.REGISTERED, 0.0)
    cost = state.routing.cost
    assert cost.prefill_model("w0").coef == pytest.approx(COEF)  # type: ignore[arg-type]
    assert state.profiler.outcomes["w0"]["state"] == "restored"
    # Negative control: without the file the worker starts from the default prior.
    fresh = RouterState(RouterConfig.from_options(profile_max_tokens=1024))
    fresh.registry.add(info(), Source.REGISTERED, 0.0)
    assert fresh.routing.cost.prefill_model("w0").coef != pytest.approx(COEF)  # type: ignore[arg-type]
    # Another namespace (new weights) is profiled afresh, not priced with the old curve.
    other = RouterState(RouterConfig.from_options(profiles_file=str(path), profile_max_tokens=1024))
    other.registry.add(info(namespace="tiny@2"), Source.REGISTERED, 0.0)
    outcomes = other.profiler.outcomes
    assert "w0" not in outcomes or outcomes["w0"]["state"] != "restored"


def test_a_fit_is_saved(tmp_path):
    path = tmp_path / "profiles.json"
    store = ProfileStore(path)
    store.put("w0", "tiny@1", PrefillModel(prior=COEF).coef)
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["profiles"]["w0"]["namespace"] == "tiny@1"
