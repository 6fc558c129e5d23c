"""The queue model (router/routing/queue_model.py): which FIFO server a slot queues on; its other
behaviour is tested through the cost model (test_cost.py)."""

from __future__ import annotations

from radix_global.types import WorkerId
from router.routing.queue_model import QueueModel


def test_a_compute_domain_is_published_on_its_first_workers_slot():
    q = QueueModel()
    assert q.lead_slot(("w", 1)) == ("w", 1)  # a slot stands for itself
    for worker in ("w2", "w1", "w3"):
        q.share_compute(WorkerId(worker), "cpu@h:0")
    assert q.lead_slot(q.server((WorkerId("w3"), 0))) == ("w1", 0)
    q.forget_worker(WorkerId("w1"))
    assert q.lead_slot(("domain", "cpu@h:0")) == ("w2", 0)
    q.share_compute(WorkerId("w2"), None)
    q.share_compute(WorkerId("w3"), "cpu@h:1")
    assert q.lead_slot(("domain", "cpu@h:0")) is None
