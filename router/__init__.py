"""The Conductor: a KV-cache-centric router in front of SGLang/vLLM workers.

Imports run one way, top to bottom (``tests/router/test_layout.py`` keeps it so):

- entry points: ``cli/`` (commands), ``http/`` (the ASGI app and the admin API);
- ``request/``: one inference request end to end;
- ``state.py``: ``RouterState``, everything one router holds, built once from the config;
- ``config.py``: ``RouterConfig``, the parts' option sections (each declared where its part lives);
- ``pd/`` -> ``cluster/``, ``economics.py`` and ``admission_ledger.py`` -> ``routing/``:
  disaggregation, the workers and the index link, what the cache was worth per request and how
  admission went, the pure routing core (contract, cost model, policies);
- ``keying/`` and ``transport/``: what a request is in cache terms; bytes on the wire;
- ``metrics.py``; then ``radix_global`` (the index).
"""
