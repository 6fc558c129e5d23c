"""Bytes on the wire: the HTTP server protocol, the upstream HTTP client, the proxy that sends a
body to a worker and reads its answer, JSON body splicing and the OpenAI error body.

Knows nothing of routing: may import ``router.config`` and the standard library / HTTP libraries.
"""
