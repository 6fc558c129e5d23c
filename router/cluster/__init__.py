"""The workers the router knows and what it learns of them: the registry, discovery (what a
worker's ``/server_info`` says) and health checks, the link to the global index (embedded or
remote), the routing slots a worker offers, prefill profiling, and hot-prefix warming/replication.

May import ``router.routing`` (its contract types), ``router.keying``, ``router.transport`` and
``radix_global``; never ``router.config`` (which holds ``HealthConfig`` and ``ModelOverrides``),
``router.request``, ``router.pd`` or ``router.http``.
"""
