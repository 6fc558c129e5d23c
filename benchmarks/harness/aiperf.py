"""NVIDIA's aiperf as an independent client: our replay plan as its custom dataset, its command
line, and its per-request records read back.

aiperf runs from its own venv (``scripts/bootstrap.sh aiperf``: ``.venv-aiperf``; its pins clash
with the main lock). It sends OpenAI ``/v1/completions`` with the plan's prompt text, so the
engine tokenizes the same text our replay sends to ``/generate`` (no chat template on either
path). Its tokenizer loader reads only the Hugging Face cache layout, so
:func:`tokenizer_cache` lays the model's tokenizer files out as one (offline).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from benchmarks.harness.paths import REPO
from radix_global.trace import prompt_text
from radix_global_tools.replay.plan import PlannedRequest

AIPERF = REPO / ".venv-aiperf" / "bin" / "aiperf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json",
                   "special_tokens_map.json", "chat_template.jinja")
# A fixed "commit" for the cache's one snapshot: aiperf only needs refs/main to name it.
SNAPSHOT = "0" * 40


class AiperfError(RuntimeError):
    """aiperf is missing, failed, or wrote records this module cannot read (message says which)."""


class ClientRecord(NamedTuple):
    """One request as a client saw it: when it was sent (seconds after the client's first send),
    TTFT and end-to-end latency (seconds; None where the request failed), and the prompt tokens
    the engine reported served from its cache (None where it did not say)."""

    sent_s: float
    ttft_s: float | None
    latency_s: float | None
    cached_tokens: int | None


def write_dataset(plan: Sequence[PlannedRequest], path: Path) -> int:
    """``plan`` as an aiperf ``mooncake_trace`` dataset: per request its prompt text, output length
    and send time (ms after the first send). Returns the number of lines written."""
    t0 = min((p.send_at_s for p in plan), default=0.0)
    with path.open("w") as f:
        for p in sorted(plan, key=lambda p: (p.send_at_s, p.position)):
            if p.after is not None:
                raise ValueError("aiperf's fixed schedule is open loop: request "
                                 f"{p.position} waits for request {p.after}")
            f.write(json.dumps({"timestamp": round((p.send_at_s - t0) * 1000.0, 3),
                                "text_input": prompt_text(p.input_ids),
                                "output_length": p.output_tokens}) + "\n")
    return len(plan)


def tokenizer_cache(model_dir: Path, hf_home: Path, name: str = "local/model") -> str:
    """Lay ``model_dir``'s tokenizer files out as the Hugging Face cache entry ``name`` under
    ``hf_home`` (run aiperf with ``HF_HOME=hf_home HF_HUB_OFFLINE=1``); returns ``name``."""
    entry = hf_home / "hub" / ("models--" + name.replace("/", "--"))
    snap = entry / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    copied = [f for f in TOKENIZER_FILES if (model_dir / f).exists()]
    if "tokenizer.json" not in copied:
        raise AiperfError(f"{model_dir} has no tokenizer.json")
    for f in copied:
        shutil.copyfile(model_dir / f, snap / f)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(SNAPSHOT)
    return name


def command(url: str, dataset: Path, artifacts: Path, tokenizer: str, model: str,
            timeout_s: float) -> list[str]:
    """aiperf's argv: ``dataset`` replayed on its timestamps against ``url``, streaming
    completions, greedy and ``ignore_eos`` like our replay, every record exported."""
    if not AIPERF.exists():
        raise AiperfError(f"{AIPERF} is missing: run scripts/bootstrap.sh aiperf")
    return [str(AIPERF), "profile", "--url", url, "--endpoint-type", "completions",
            "--streaming", "--model", model, "--tokenizer", tokenizer,
            "--input-file", str(dataset), "--custom-dataset-type", "mooncake_trace",
            "--fixed-schedule", "--fixed-schedule-auto-offset",
            "--extra-inputs", json.dumps({"ignore_eos": True, "temperature": 0.0}),
            "--request-timeout-seconds", f"{timeout_s:g}",
            "--export-level", "records", "--ui-type", "none",
            # Nothing else on the wire than our replay sends: no scrape of the router's /metrics
            # during the run, no probe for GPU exporters.
            "--no-server-metrics", "--no-gpu-telemetry",
            "--output-artifact-dir", str(artifacts)]


def read_records(artifacts: Path) -> list[ClientRecord]:
    """The per-request records of an aiperf run (``profile_export.jsonl``; its profiling phase
    only), in send order; an errored or cancelled request has no TTFT."""
    path = artifacts / "profile_export.jsonl"
    if not path.exists():
        raise AiperfError(f"aiperf wrote no {path.name} under {artifacts}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            meta = row["metadata"]
            start_ns = int(meta["request_start_ns"])
            metrics = row.get("metrics") or {}
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise AiperfError(f"{path}:{n}: not an aiperf record ({exc})") from exc
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue  # a warm-up request: not one of the plan's
        failed = row.get("error") is not None or bool(meta.get("was_cancelled"))
        cached = (metrics.get("usage_prompt_cache_read_tokens") or {}).get("value")
        rows.append((start_ns, ClientRecord(
            0.0, None if failed else _seconds(metrics, "time_to_first_token"),
            None if failed else _seconds(metrics, "request_latency"),
            int(cached) if isinstance(cached, int | float) else None)))
    if not rows:
        raise AiperfError(f"{path} has no records")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [r._replace(sent_s=(s - t0) / 1e9) for s, r in rows]


def _seconds(metrics: dict[str, object], tag: str) -> float | None:
    m = metrics.get(tag)
    if not isinstance(m, dict) or not isinstance(m.get("value"), int | float):
        return None
    scale = {"ms": 1e-3, "ns": 1e-9, "s": 1.0, "us": 1e-6}.get(str(m.get("unit", "ms")))
    if scale is None:
        raise AiperfError(f"{tag} in unit {m.get('unit')!r}")
    return float(m["value"]) * scale
