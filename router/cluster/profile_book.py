"""Which worker has its own fitted prefill profile, and what a worker without one is priced with
meanwhile (the mean curve of its profiled peers in the same namespace). Pure bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from router.routing.prefill_model import PrefillModel


def inherited_model(peers: Sequence[PrefillModel]) -> PrefillModel:
    """A fresh model whose prior is the mean fitted curve of ``peers`` (same model, same
    namespace): the joining worker's own observations then refit a copy, never a peer's model."""
    if not peers:
        raise ValueError("need at least one peer model")
    coef = np.mean(np.array([p.coef for p in peers]), axis=0)
    return PrefillModel(prior=tuple(float(c) for c in coef))


class ProfileBook:
    """Which worker of which namespace has its own fitted prefill profile. Pure bookkeeping.

    A worker without one yet (profiling pending, failed or off) is priced with the mean fitted
    curve of its profiled peers in the same namespace (:func:`inherited_model`) instead of the
    GPU-like default prior, which would make it look ~50x faster than its CPU peers and draw
    every request to it while its own profile runs.
    """

    def __init__(self) -> None:
        self._namespace: dict[str, str] = {}  # worker id -> namespace
        self._fitted: dict[str, PrefillModel] = {}  # worker id -> its own profiled model

    def joined(self, worker_id: str, namespace: str) -> PrefillModel | None:
        """Record a joining worker; the model to price it with until its own profile is fitted
        (None: no profiled peer, keep the default prior)."""
        self._namespace[worker_id] = namespace
        self._fitted.pop(worker_id, None)
        return self._inheritance(namespace)

    def fitted(self, worker_id: str, model: PrefillModel) -> dict[str, PrefillModel]:
        """Record ``worker_id``'s own profile; returns the new inherited model of every other
        worker of its namespace that has none (they follow the mean of the profiled peers)."""
        namespace = self._namespace.get(worker_id)
        if namespace is None:
            return {}
        self._fitted[worker_id] = model
        heirs = [w for w, ns in self._namespace.items()
                 if ns == namespace and w not in self._fitted]
        if not heirs:
            return {}
        out: dict[str, PrefillModel] = {}
        for w in heirs:  # one copy each: each refits on its own observations
            inherited = self._inheritance(namespace)
            assert inherited is not None  # worker_id itself is a fitted peer
            out[w] = inherited
        return out

    def left(self, worker_id: str) -> None:
        self._namespace.pop(worker_id, None)
        self._fitted.pop(worker_id, None)

    def has_own(self, worker_id: str) -> bool:
        return worker_id in self._fitted

    def _inheritance(self, namespace: str) -> PrefillModel | None:
        peers = [m for w, m in sorted(self._fitted.items()) if self._namespace.get(w) == namespace]
        return inherited_model(peers) if peers else None
