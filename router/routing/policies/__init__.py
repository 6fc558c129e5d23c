"""Routing policies and their registry: ``get_policy(name, slo=None, **options)``.

Names: ``random``, ``round_robin``, ``least_load``, ``approx_cache``, ``conductor``. The contract
every policy follows is in :mod:`router.routing.contract`. A policy's options are its
constructor's keyword parameters, typed by their hints and checked before it is built
(:mod:`router.routing.policies.options`): an unknown name or a value of the wrong type is a
:class:`PolicyConfigError` naming the valid options. The admission SLO is not a policy option:
the router has one :class:`router.routing.admission.SloConfig` (``RouterConfig.slo``),
handed to every policy that takes ``slo``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from router.routing.admission import SloConfig
from router.routing.contract import PolicyConfigError, RoutingPolicy
from router.routing.policies.options import check_options, option_hints

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


def policy_class(name: str) -> type[RoutingPolicy]:
    """The class of policy ``name``; :class:`PolicyConfigError` naming the known ones."""
    target = _POLICIES.get(name)
    if target is None:
        raise PolicyConfigError(f"unknown policy {name!r}; known: {', '.join(_POLICIES)}")
    module_name, class_name = target.split(":")
    cls: type[RoutingPolicy] = getattr(importlib.import_module(module_name), class_name)
    return cls


def policy_options(name: str) -> dict[str, Any]:
    """Option name -> type hint of policy ``name`` (for help and error messages)."""
    return option_hints(policy_class(name))


def check_policy(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``name`` and ``options`` without building the policy; the coerced options."""
    return check_options(name, policy_class(name), options)


def get_policy(name: str, slo: SloConfig | None = None, **options: Any) -> RoutingPolicy:
    """A fresh policy instance. Unknown name or option, or a bad value ->
    :class:`PolicyConfigError`. ``slo``: the admission SLO, for a policy that admits (the
    conductor); ignored by the others."""
    cls = policy_class(name)
    checked = check_options(name, cls, options)
    if slo is not None and "slo" in inspect.signature(cls).parameters:
        checked["slo"] = slo
    try:
        policy: RoutingPolicy = cls(**checked)
    except TypeError as exc:
        raise PolicyConfigError(f"bad option for policy {name!r}: {exc}") from exc
    return policy


__all__ = ["PolicyConfigError", "RoutingPolicy", "check_policy", "get_policy", "policy_class",
           "policy_names", "policy_options"]
