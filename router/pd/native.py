"""Native-mode PD (SGLang's own disaggregation) bookkeeping of the HTTP front end: busy time of
the prefill and decode workers for the utilisation report (``/admin/stats`` key ``pd``,
``radix-global status``), as the pool hand-off keeps it in ``router/pd/pool_front.py``.

A prefill worker is busy from when the router sends it a request until its answer (SGLang's
prefill server answers once the KV has left); a decode worker from the same moment (SGLang sends
both halves at once: the decode side holds its KV slots while the prefill runs) until the
client's answer ends. Native mode has no decode retry: ``decode_retries`` stays 0.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from router.pd.protocol import PdConfig, PdMode, PdUtilization

if TYPE_CHECKING:
    from router.state import RouterState

_UTILS: weakref.WeakKeyDictionary[Any, PdUtilization] = weakref.WeakKeyDictionary()


def native_util(state: RouterState) -> PdUtilization:
    """The router's native-mode utilisation tracker (created on first use)."""
    util = _UTILS.get(state)
    if util is None:
        config = PdConfig.parse_ratio(state.config.pd_ratio, mode=PdMode.NATIVE)
        util = _UTILS[state] = PdUtilization(config)
    return util


def native_util_if_used(state: RouterState) -> PdUtilization | None:
    return _UTILS.get(state)
