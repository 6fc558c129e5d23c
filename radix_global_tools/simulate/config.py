"""Simulator configuration: calibration of the simulated cluster and the experiment ranges.

Loaded from a TOML file (``paper_config.toml`` is the committed paper calibration). Frozen
dataclasses: a run never mutates its configuration; CLI overrides build a new one.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from radix_global_tools.simulate.decode import DecodeProfile

DEFAULT_CONFIG = Path(__file__).with_name("paper_config.toml")
# The CPU analogue's (benchmarks/scenarios/fig10_cpu.py), measured on this project's engines.
CPU_CONFIG = Path(__file__).with_name("cpu_config.toml")


class SimConfigError(ValueError):
    """A configuration file that is missing a field or has a bad value."""


@dataclass(frozen=True)
class Calibration:
    """Cost of one simulated prefill node (times in seconds, sizes in tokens/bytes)."""

    kv_bytes_per_token: int = 327680
    page_tokens: int = 512
    fixed_s: float = 0.03
    linear_s_per_token: float = 1.12e-4
    quadratic_s_per_token2: float = 1.05e-9
    bandwidth_bytes_per_s: float = 87e9
    fetch_latency_s: float = 0.002
    first_token_s: float = 0.03
    local_tokens_per_instance: int = 3_000_000
    pool_tokens_per_instance: int = 3_000_000
    ttft_slo_s: float = 30.0
    decode: DecodeProfile = field(default_factory=DecodeProfile)
    # A faster prefill kernel (what-if): every prefill time divided by this.
    prefill_speedup: float = 1.0
    # A disk tier under the pool reads at this (None: the profile has none, so no plan has one).
    disk_read_bytes_per_s: float | None = None

    def prefill_s(self, input_tokens: int, prefix_tokens: int) -> float:
        """Compute time of a prefill whose first ``prefix_tokens`` are reused (causal attention:
        the new tokens attend to everything before them)."""
        p = max(0, min(prefix_tokens, input_tokens))
        return (
            self.fixed_s
            + self.linear_s_per_token * (input_tokens - p)
            + self.quadratic_s_per_token2 * (input_tokens * input_tokens - p * p)
        ) / self.prefill_speedup

    def handoff_s(self, tokens: int, prefill_s: float) -> float:
        """What a prompt's KV hand-off to its decode instance (PD) adds after its prefill: sent
        layer by layer while the prefill runs (Mooncake), only the part of the transfer that
        outlasts the prefill shows."""
        return max(0.0, self.fetch_s(tokens) - prefill_s)

    def fetch_s(self, tokens: int, bandwidth_Bps: float | None = None) -> float:
        """``tokens`` of KV moved at ``bandwidth_Bps`` (default: the fabric's)."""
        if tokens <= 0:
            return 0.0
        bw = self.bandwidth_bytes_per_s if bandwidth_Bps is None else bandwidth_Bps
        return self.fetch_latency_s + tokens * self.kv_bytes_per_token / bw

    @property
    def disk_fetch_Bps(self) -> float:
        """A fetch from the disk tier: the disk's read, then the fabric, whichever is slower."""
        if self.disk_read_bytes_per_s is None:
            raise SimConfigError("the hardware profile has no [disk] table")
        return min(self.disk_read_bytes_per_s, self.bandwidth_bytes_per_s)

    def disk_fetch_s(self, tokens: int) -> float:
        return self.fetch_s(tokens, self.disk_fetch_Bps)

    def prior_coefficients(self) -> tuple[float, float, float, float]:
        """The same curve in ``router.routing.prefill_model`` features ``[1, m, m*p, m^2]``
        (thousands of tokens, m = new tokens): n^2 - p^2 = m^2 + 2 m p."""
        k, f = 1000.0, 1.0 / self.prefill_speedup
        q = self.quadratic_s_per_token2 * k * k * f
        return (self.fixed_s * f, self.linear_s_per_token * k * f, 2 * q, q)


@dataclass(frozen=True)
class SimConfig:
    calibration: Calibration = field(default_factory=Calibration)
    trace: str = ""
    limit: int = 3000
    seed: int = 0
    fig5_instances: int = 16
    fig5_loads: tuple[float, ...] = (1.0,)
    paper_fig5: dict[str, float] = field(default_factory=dict)
    fig10_instances: int = 10
    fig10_local_tokens: int = 3_000_000
    fig10_load: float = 1.0
    paper_fig10_hit_ratio: float = 2.22
    paper_fig10_prefill_ratio: float = 0.76
    admission_instances: int = 16
    admission_load: float = 4.0
    scale_instances: tuple[int, ...] = (16,)
    scale_requests_per_copy: int = 300
    scale_load: float = 1.0


def _get(table: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in table:
        raise SimConfigError(f"{where}: missing {key!r}")
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise SimConfigError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _read(path: Path | str) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SimConfigError(f"cannot read {path}: {exc}") from exc


def _table(doc: dict[str, Any], name: str) -> dict[str, Any]:
    t = doc.get(name)
    if not isinstance(t, dict):
        raise SimConfigError(f"missing table [{name}]")
    return t


def calibration_from(doc: dict[str, Any]) -> Calibration:
    """The [model] [prefill] [network] [decode] [cache] [slo] tables of a simulator file, and
    its optional [disk] table."""
    model, pre, net = _table(doc, "model"), _table(doc, "prefill"), _table(doc, "network")
    dec, cache, slo = _table(doc, "decode"), _table(doc, "cache"), _table(doc, "slo")
    cal = Calibration(
        kv_bytes_per_token=_get(model, "kv_bytes_per_token", int, "model"),
        page_tokens=_get(model, "page_tokens", int, "model"),
        fixed_s=_get(pre, "fixed_s", float, "prefill"),
        linear_s_per_token=_get(pre, "linear_s_per_token", float, "prefill"),
        quadratic_s_per_token2=_get(pre, "quadratic_s_per_token2", float, "prefill"),
        bandwidth_bytes_per_s=_get(net, "bandwidth_bytes_per_s", float, "network"),
        fetch_latency_s=_get(net, "fetch_latency_s", float, "network"),
        first_token_s=_get(dec, "first_token_s", float, "decode"),
        local_tokens_per_instance=_get(cache, "local_tokens_per_instance", int, "cache"),
        pool_tokens_per_instance=_get(cache, "pool_tokens_per_instance", int, "cache"),
        ttft_slo_s=_get(slo, "ttft_slo_s", float, "slo"),
        decode=DecodeProfile(
            step_fixed_s=_get(dec, "step_fixed_s", float, "decode"),
            step_per_request_s=_get(dec, "step_per_request_s", float, "decode"),
            step_per_context_token_s=_get(dec, "step_per_context_token_s", float, "decode"),
            kv_tokens_per_instance=_get(dec, "kv_tokens_per_instance", int, "decode"),
        ),
    )
    if cal.page_tokens < 1 or cal.bandwidth_bytes_per_s <= 0:
        raise SimConfigError("page_tokens and bandwidth must be positive")
    if "disk" in doc:  # optional: a profile without it plans no disk tier
        disk = _table(doc, "disk")
        read = _get(disk, "read_bytes_per_s", float, "disk")
        if not read > 0:
            raise SimConfigError("disk.read_bytes_per_s must be positive")
        cal = replace(cal, disk_read_bytes_per_s=read)
    d = cal.decode
    if d.step_fixed_s <= 0 or min(d.step_per_request_s, d.step_per_context_token_s) < 0 \
            or d.kv_tokens_per_instance < 1:
        raise SimConfigError("decode: step_fixed_s and kv_tokens_per_instance must be positive, "
                             "the per-request and per-token terms not negative")
    return cal


def load_calibration(path: Path | str) -> Calibration:
    """Only the calibration of a simulator file (e.g. ``cpu_config.toml``)."""
    return calibration_from(_read(path))


def load_config(path: Path | str = DEFAULT_CONFIG) -> SimConfig:
    """Parse a simulator TOML file; any missing or mistyped field -> :class:`SimConfigError`."""
    doc = _read(path)
    run = _table(doc, "run")
    f5, f10, adm, sc = (_table(doc, "fig5"), _table(doc, "fig10"), _table(doc, "admission"),
                        _table(doc, "scale"))
    cal = calibration_from(doc)
    loads = tuple(float(x) for x in _get(f5, "loads", list, "fig5"))
    if not loads or min(loads) <= 0:
        raise SimConfigError("fig5.loads must be positive rate multipliers")
    return SimConfig(
        calibration=cal,
        # A relative trace path is relative to the config file (the repo sits beside shared/).
        trace=str((Path(path).parent / _get(run, "trace", str, "run")).resolve()),
        limit=_get(run, "limit", int, "run"),
        seed=_get(run, "seed", int, "run"),
        fig5_instances=_get(f5, "instances", int, "fig5"),
        fig5_loads=loads,
        paper_fig5={k: float(v) for k, v in _get(f5, "paper_mean_ttft_s", dict, "fig5").items()},
        fig10_instances=_get(f10, "instances", int, "fig10"),
        fig10_local_tokens=_get(f10, "local_tokens_per_instance", int, "fig10"),
        fig10_load=_get(f10, "load", float, "fig10"),
        paper_fig10_hit_ratio=_get(f10, "paper_hit_rate_ratio", float, "fig10"),
        paper_fig10_prefill_ratio=_get(f10, "paper_prefill_time_ratio", float, "fig10"),
        admission_instances=_get(adm, "instances", int, "admission"),
        admission_load=_get(adm, "load", float, "admission"),
        scale_instances=tuple(int(x) for x in _get(sc, "instances", list, "scale")),
        scale_requests_per_copy=_get(sc, "requests_per_copy", int, "scale"),
        scale_load=_get(sc, "load", float, "scale"),
    )
