"""Routing policies and their registry: ``get_policy(name, **config)``.

Names: ``random``, ``round_robin``, ``least_load``, ``approx_cache``, ``conductor``. The contract
every policy follows is in :mod:`router.routing.contract`.
"""

from __future__ import annotations

import importlib
from typing import Any

from router.routing.contract import PolicyConfigError, RoutingPolicy

# name -> "module:Class"; imported on first use so a light router pays only for what it runs.
_POLICIES: dict[str, str] = {
    "random": "router.routing.policies.random_policy:RandomPolicy",
    "round_robin": "router.routing.policies.round_robin:RoundRobinPolicy",
    "least_load": "router.routing.policies.least_load:LeastLoadPolicy",
    "approx_cache": "router.routing.policies.approx_cache:ApproxCachePolicy",
    "conductor": "router.routing.policies.conductor:ConductorPolicy",
}


def policy_names() -> list[str]:
    return list(_POLICIES)


def get_policy(name: str, **config: Any) -> RoutingPolicy:
    """A fresh policy instance. Unknown name or option -> :class:`PolicyConfigError`."""
    target = _POLICIES.get(name)
    if target is None:
        raise PolicyConfigError(f"unknown policy {name!r}; known: {', '.join(_POLICIES)}")
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    try:
        policy: RoutingPolicy = cls(**config)
    except TypeError as exc:
        raise PolicyConfigError(f"bad option for policy {name!r}: {exc}") from exc
    return policy


__all__ = ["PolicyConfigError", "RoutingPolicy", "get_policy", "policy_names"]
