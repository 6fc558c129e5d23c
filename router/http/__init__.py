"""The router's HTTP surface: ``app.py`` (the ASGI app: inference routes, models, health,
metrics) and ``admin.py`` (the ``/admin`` API). An entry point: may import anything in ``router``.
"""
