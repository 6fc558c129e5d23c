"""How long a Mooncake transfer may hang on a peer that went silent (``docs/interfaces.md``,
"Mooncake Store as the L3 pool": the stall's bound).

A read in flight to a host whose cable is pulled gets no reset back: Mooncake's TCP transport
waits for the peer's status frame (``MC_TCP_STATUS_TIMEOUT_SEC``) or for more payload
(``MC_TCP_PROGRESS_TIMEOUT_SEC``, sliding with every slice received, 64 KiB), 30 s each by
default, and the pool's lock is held all that time. Both are read from the process
environment, so the pool sets them before its client starts (the launch wrapper sets them for
the engine process already). A value the operator set is kept. A lane slower than a slice per
bound is cut too: 64 KiB in 10 s is 52 kbit/s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, MutableMapping

from sglang_patch.pool.base import PoolError

STALL_ENV = ("MC_TCP_STATUS_TIMEOUT_SEC", "MC_TCP_PROGRESS_TIMEOUT_SEC")
# A slice (64 KiB) in 10 s is 52 kbit/s a lane, under any live link's; 5 s cut a live read
# once on a congested test cable (one TCP flow in retransmission backoff), hence the margin.
# The transport's 30 s was measured as the stall of a read in flight to a dead host
# (docs/benchmarks.md, "Copies across fault domains").
DEFAULT_READ_STALL_S = 10
log = logging.getLogger(__name__)


def stall_seconds(config: Mapping[str, object]) -> float:
    """``pool_read_stall_s`` of a backend's extra config (:data:`DEFAULT_READ_STALL_S` when
    absent); :class:`PoolError` when it is no number (the pool and the launch wrapper read it
    alike)."""
    raw = config.get("pool_read_stall_s", DEFAULT_READ_STALL_S)
    if not isinstance(raw, bool):
        try:
            return float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pass
    raise PoolError(f"pool_read_stall_s must be a number of seconds, got {raw!r}")


def bound_stalls(seconds: float, environ: MutableMapping[str, str]) -> dict[str, int]:
    """Set each of :data:`STALL_ENV` that ``environ`` lacks to ``seconds`` (rounded up to
    whole seconds: Mooncake reads an integer) and return every one's value in force. Raises
    :class:`PoolError` for a bound that is not a positive number, or an operator's value that
    Mooncake would ignore (it falls back to its 30 s for anything but a positive integer)."""
    if isinstance(seconds, bool) or not (isinstance(seconds, int | float)
                                         and math.isfinite(seconds) and seconds > 0):
        raise PoolError(f"pool_read_stall_s must be a positive number of seconds, got {seconds!r}")
    out: dict[str, int] = {}
    for name in STALL_ENV:
        if name not in environ:
            environ[name] = str(math.ceil(seconds))
        elif environ[name] != str(math.ceil(seconds)):
            log.info("%s=%s from the environment, not pool_read_stall_s %s", name,
                     environ[name], seconds)
        value = environ[name]
        if not (value.isascii() and value.isdigit()) or int(value) <= 0:
            raise PoolError(f"{name}={value!r}: Mooncake wants a positive whole number of "
                            f"seconds (it would fall back to 30)")
        out[name] = int(value)
    return out
