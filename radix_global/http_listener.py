"""An HTTP listener beside a process's main server, on the same event loop: the index service's
Mooncake Conductor API (``conductor_api.py``) and ``/metrics`` (``index_http.py``), the router's
``--metrics-port`` (``router/http/app.py``).

Signals stay the caller's: uvicorn's own handlers would replace the index service's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any


class Listener:
    """A running listener: ``port`` (the bound one), ``await stop()``. ``companions``: tasks
    that live as long as it (cancelled at stop)."""

    def __init__(self, server: Any, serving: asyncio.Task[Any]) -> None:
        self._server, self._serving = server, serving
        self.companions: list[asyncio.Task[Any]] = []
        self.port = int(server.servers[0].sockets[0].getsockname()[1])

    async def stop(self) -> None:
        self._server.should_exit = True
        for task in self.companions:
            task.cancel()
        for task in (*self.companions, self._serving):
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def listen(app: Any, host: str, port: int, name: str) -> Listener:
    """Serve the ASGI ``app`` on ``host:port`` (0: any free port); returns once it listens,
    :class:`OSError` when it cannot bind."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            log_config=None, access_log=False, lifespan="off", ws="none",
                            proxy_headers=False,  # the peer is the socket's, never a header's
                            timeout_keep_alive=5, limit_concurrency=1024)
    server = _Server(config)
    serving = asyncio.create_task(server.serve(), name=name)
    while not server.started:
        if serving.done():  # uvicorn exits (SystemExit) when it cannot bind
            with contextlib.suppress(BaseException):
                serving.result()
            raise OSError(f"{name} cannot listen on {host}:{port}")
        await asyncio.sleep(0.01)
    return Listener(server, serving)


def companion(listener: Listener, work: Awaitable[Any], name: str) -> None:
    """Run ``work`` as long as ``listener``."""
    listener.companions.append(asyncio.ensure_future(work))
    listener.companions[-1].set_name(name)
