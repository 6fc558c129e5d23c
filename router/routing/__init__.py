"""Where a request goes: the routing contract, the cost model and the policies (pure, no I/O).

``contract.py`` holds the types every part of the router exchanges (``RouteRequest``,
``WorkerState``, ``Decision``, ``IndexView``, the ``RoutingPolicy`` ABC); ``driver.py`` runs one
decision (policy, cost model, decode pairing, admission); ``cost.py`` prices a placement from the
queue, prefill and topology models; ``admission.py`` and ``decode_select.py`` say no early;
``policies/`` has one file per policy, chosen from a registry. Imports only ``radix_global``:
nothing here knows HTTP, workers' processes, the router's
state or its config (each part has its own small frozen config, built by ``router.config``).
"""
