"""Runs a real IndexServer (gRPC on 127.0.0.1, a free port) on its own event loop thread, so
tests can use the blocking IndexClient against it."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

from radix_global.service import IndexServer, ServiceConfig


class ServerThread:
    """``with ServerThread(config) as st: IndexClient(st.target)``; stop() writes the snapshot."""

    def __init__(self, config: ServiceConfig) -> None:
        self.server = IndexServer(config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (the index is single-owner) and return its result
        (awaited when it is awaitable: ``st.run(lambda: st.server.state.register(info))``)."""
        async def call() -> Any:
            result = fn()
            return (await result) if inspect.isawaitable(result) else result
        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=10)

    def start(self) -> ServerThread:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout=10)
        except BaseException:
            self._close_loop()
            raise
        return self

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(0.2), self._loop).result(timeout=10)
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
