"""Prefill/decode disaggregation: ``protocol.py`` (request bodies, configuration, utilisation:
pure), ``orchestrator.py`` (choosing and reserving the decode worker before anything runs),
``run.py`` (one started hand-off: prefill, wait for the pool, decode with retries) and
``pool_front.py`` (what the router holds for pool mode: decode capacities, the pool probe).

May import ``router.cluster``, ``router.routing``, ``router.keying``, ``router.transport`` and
``radix_global``; native PD needs no orchestration and is sent by ``router/request/relay.py``.
"""
