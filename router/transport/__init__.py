"""Bytes on the wire: the HTTP server protocol, the upstream HTTP client, the proxy that sends a
body to a worker and reads its answer, JSON body splicing and the OpenAI error body.

Knows nothing of routing: imports only the standard library and HTTP libraries (its configs,
``ProxyConfig`` and ``ServerLimits``, are built by ``router.config``).
"""
