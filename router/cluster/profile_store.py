"""Fitted prefill profiles kept across router restarts (option ``profiles_file``, issue 16).

A restarted router prices a returning worker (same worker id, same namespace) with the profile it
had fitted before, at once, instead of the default prior until a new profiling run is done. The
file is JSON, ``{"version": 1, "profiles": {"<worker id>": {"namespace": NS, "coef": [4
floats]}}}``, rewritten whole (``radix_global.snapshot.write_snapshot``: temporary file,
sync, rename) after each fit; a missing, unreadable or
malformed file is an empty store (logged), never a failed start.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from radix_global.snapshot import write_snapshot

log = logging.getLogger("radix_global.router")

VERSION = 1


class ProfileStore:
    """worker id -> (namespace, prefill coefficients), backed by one file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._profiles: dict[str, tuple[str, tuple[float, ...]]] = {}
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("prefill profiles %s unreadable, starting without: %r", self.path, exc)
            return
        profiles = data.get("profiles") if isinstance(data, dict) else None
        if not isinstance(profiles, dict) or data.get("version") != VERSION:
            log.warning("prefill profiles %s: not a version-%d file, ignored", self.path, VERSION)
            return
        for wid, p in profiles.items():
            coef = p.get("coef") if isinstance(p, dict) else None
            if (isinstance(p, dict) and isinstance(p.get("namespace"), str)
                    and isinstance(coef, list) and len(coef) == 4
                    and all(isinstance(c, int | float) and math.isfinite(c) for c in coef)):
                self._profiles[str(wid)] = (p["namespace"], tuple(float(c) for c in coef))

    def get(self, worker_id: str, namespace: str) -> tuple[float, ...] | None:
        """The coefficients saved for this worker in this namespace (None: none, or another
        model since)."""
        saved = self._profiles.get(worker_id)
        return saved[1] if saved is not None and saved[0] == namespace else None

    def put(self, worker_id: str, namespace: str, coef: tuple[float, ...]) -> None:
        self._profiles[worker_id] = (namespace, tuple(coef))
        data = {"version": VERSION, "profiles": {
            w: {"namespace": ns, "coef": list(c)} for w, (ns, c) in self._profiles.items()}}
        try:
            write_snapshot(self.path, json.dumps(data).encode())  # atomic, synced
        except OSError as exc:  # the profile still prices this run; only the restart loses it
            log.warning("cannot save prefill profiles to %s: %r", self.path, exc)
