"""One inference request end to end: ``handler.py`` parses, keys and routes it; ``relay.py``
forwards it to the chosen worker(s) as an ASGI response, retries a refused connection elsewhere,
and relays the answer (``native_pd.py``: the prefill half of a native PD request);
``pool_relay.py`` does the same for a pool prefill/decode hand-off;
``finish.py`` is the one place a request's outcome is booked.

May import everything below the entry points (``router.state``, routing, cluster, pd, keying,
transport); only ``router.http`` imports this package.
"""
