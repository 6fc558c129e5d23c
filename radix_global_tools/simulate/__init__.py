"""Paper-scale discrete-event simulation of a prefill cluster driving the real index and policies.

``radix-global simulate`` (:mod:`radix_global_tools.simulate.main`). A simulated clock replaces wall
time; the global index (``radix_global.index``), the routing policies (``router.routing.policies``)
and the cost model (``router.routing.cost``) are the production code, fed by simulated instances'
cache events.
"""
