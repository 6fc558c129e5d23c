"""Several routers, one view: the coordination service the cluster's routers share
(``docs/interfaces.md``, "Several routers, one view"). ``records`` and ``load_view`` are pure;
``link`` is the async Redis client; ``bridge`` applies what peers wrote to one router."""
