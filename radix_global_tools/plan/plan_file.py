"""The plan as files a deployment reads: ``<tag>.toml`` (the cluster) and ``<tag>_router.toml``
(``radix-global router --config``: the SLOs and the decode model the plan was made with).

The plan file's tables and keys are in ``docs/interfaces.md``, "The capacity plan file and the
decode model".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from radix_global_tools.plan.search import Candidate, Targets
from radix_global_tools.simulate.config import Calibration

PLAN_VERSION = 1


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml(tables: Mapping[str, Mapping[str, Any]], header: str) -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for name, table in tables.items():
        lines += ["", f"[{name}]"] if name else [""]
        lines += [f"{k} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def plan_tables(best: Candidate, cal: Calibration, targets: Targets, colocated: bool,
                source: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    o, s = best.outcome, best.outcome.sizing
    kv = cal.kv_bytes_per_token
    decoding = s.prefill if colocated else s.decode
    return {
        "plan": {"version": PLAN_VERSION, **source, "ttft_slo_s": targets.ttft_slo_s,
                 "tbt_slo_s": targets.tbt_slo_s, "accept": targets.accept,
                 "mode": "colocated" if colocated else "pd"},
        "cluster": {"prefill_instances": s.prefill, "decode_instances": s.decode},
        "cache": {
            # decode KV memory: what running requests decode in
            "device_bytes": decoding * cal.decode.kv_tokens_per_instance * kv,
            # the prefill instances' own caches (device + host tier), as planned
            "host_bytes": s.prefill * (s.host_tokens or cal.local_tokens_per_instance) * kv,
            "pool_bytes": s.pool_tokens * kv,
            # extra copies of hot prefixes kept in the pool's segments (--copies only)
            **({"pool_copies": s.copies} if s.copies is not None else {}),
            "disk_bytes": s.disk_tokens * kv,  # the disk tier under the pool (0: none)
        },
        "fabric": {"bandwidth_bytes_per_s": s.bandwidth_Bps},
        "predicted": {"share_meeting_both": o.both_share, "ttft_share": o.ttft_share,
                      "tbt_share": o.tbt_share, "hit_rate": o.hit_rate,
                      "p99_ttft_s": o.p99_ttft_s, "p99_tbt_s": o.p99_tbt_s,
                      "cost_per_hour": best.cost},
    }


def router_tables(cal: Calibration, targets: Targets) -> dict[str, dict[str, Any]]:
    d = cal.decode
    return {"": {"ttft_slo_s": targets.ttft_slo_s, "pd_tbt_slo_s": targets.tbt_slo_s,
                 "decode_tbt_base_s": d.step_fixed_s,
                 "decode_tbt_per_request_s": d.step_per_request_s}}


def write_plan(out: Path, tag: str, command: str, best: Candidate, cal: Calibration,
               targets: Targets, colocated: bool, source: Mapping[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    plan, router = out / f"{tag}.toml", out / f"{tag}_router.toml"
    header = f"Written by: {command}"
    plan.write_text(_toml(plan_tables(best, cal, targets, colocated, source),
                          "A capacity plan (docs/interfaces.md, \"The capacity plan file and "
                          "the decode model\").\n"
                          + header))
    router.write_text(_toml(router_tables(cal, targets),
                            "radix-global router --config FILE: the plan's SLOs and decode "
                            "model.\n" + header))
    return [plan, router]
