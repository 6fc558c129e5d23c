"""Cost weights of a plan: per instance, per GiB of host cache, pool and disk, per Gbit/s of
fabric, per hour.

Read from a TOML file with one ``[cost]`` table (``default_costs.toml`` holds the defaults and
says what each weight means); a key the file leaves out keeps its default, an unknown key or a
negative value is an error.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from radix_global_tools.plan.sizing import Sizing

DEFAULT_COSTS = Path(__file__).with_name("default_costs.toml")
GIB = 2**30


class CostFileError(ValueError):
    """A cost file that cannot be read, or has an unknown or negative weight."""


@dataclass(frozen=True)
class CostWeights:
    prefill_instance: float = 16.0
    decode_instance: float = 16.0
    pool_gib: float = 0.005
    host_gib: float = 0.005
    disk_gib: float = 0.0002
    bandwidth_gbit: float = 0.002

    def of(self, s: Sizing, kv_bytes_per_token: int, host_tokens: int,
           device_tokens: int = 0) -> float:
        """The hourly cost of cluster ``s`` (``host_tokens``: each prefill instance's own cache
        where ``s`` leaves it to the profile; the first ``device_tokens`` of it are the
        device's, paid with the instance)."""
        instances = s.prefill + s.decode
        host = max(0, (s.host_tokens if s.host_tokens is not None else host_tokens)
                   - device_tokens)
        return (self.prefill_instance * s.prefill + self.decode_instance * s.decode
                + self.host_gib * s.prefill * host * kv_bytes_per_token / GIB
                + self.pool_gib * s.pool_tokens * kv_bytes_per_token / GIB
                + self.disk_gib * s.disk_tokens * kv_bytes_per_token / GIB
                + self.bandwidth_gbit * s.bandwidth_Bps * 8 / 1e9 * instances)


def load_costs(path: Path | str | None = None) -> CostWeights:
    """The defaults, overridden by ``path``'s ``[cost]`` table if given."""
    weights = _read(DEFAULT_COSTS)
    if path is not None:
        weights.update(_read(Path(path)))
    return CostWeights(**weights)


def _read(path: Path) -> dict[str, float]:
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CostFileError(f"cannot read {path}: {exc}") from exc
    table = doc.get("cost")
    if not isinstance(table, dict):
        raise CostFileError(f"{path}: missing table [cost]")
    known = {f.name for f in fields(CostWeights)}
    out: dict[str, float] = {}
    for key, value in table.items():
        if key not in known:
            raise CostFileError(f"{path}: unknown cost {key!r} (known: {', '.join(sorted(known))})")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise CostFileError(f"{path}: cost.{key} must be a number >= 0, got {value!r}")
        out[key] = float(value)
    return out
