"""Register a worker with the router / index and keep it registered (``docs/interfaces.md``,
"Worker registration").

- :func:`namespace_for` / :func:`model_version`: the namespace ``<model>@<version>``, the one
  rule of ``radix_global/namespaces.py`` (the router names a command-line worker's namespace with
  it too, so both kinds of worker of one model share a namespace).
- :class:`Registrar`: ``POST {url}/admin/workers`` (``WorkerInfo`` JSON, ``Authorization: Bearer``
  admin token), a heartbeat thread (``POST .../{id}/heartbeat`` every interval; a ``404`` means the
  router forgot us: register again), and ``DELETE .../{id}`` on shutdown. Several routers that
  share one view (a coordination service) are given comma-separated (:func:`router_urls`): the
  worker talks to the first that answers and moves on when it does not, so a dead router does
  not let the worker's registration expire.

Failures are typed: a refusal (4xx other than 404 on heartbeat) is a :class:`RegistrationRefused`
with the router's message; an unreachable router is retried until ``connect_timeout_s``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from radix_global import kv_size
from radix_global.namespaces import model_version, namespace_for
from radix_global.registration import WorkerInfo, encode_worker_info

__all__ = ["TOKEN_ENV", "Registrar", "RegistrationRefused", "first_answer", "kv_bytes_per_token",
           "model_version", "namespace_for", "router_urls"]

log = logging.getLogger(__name__)
TOKEN_ENV = "RADIX_GLOBAL_ADMIN_TOKEN"


class RegistrationRefused(RuntimeError):
    """The router answered a registration with an error status (bad record, conflict, auth)."""


def kv_bytes_per_token(model_path: str, server: Mapping[str, Any]) -> int | None:
    """The ``WorkerInfo.kv_bytes_per_token`` of this worker, from the model's ``config.json``
    here on the worker's host (the router may not have the folder) and its ``/server_info``
    (``server``: KV dtype, TP size; its KV pool when the folder says nothing): the one rule of
    :func:`radix_global.kv_size.for_worker`. None when neither says."""
    return kv_size.for_worker(model_path, server)


def router_urls(value: str) -> list[str]:
    """The routers a worker talks to: one URL, or several that share one view, comma-separated
    (``http://r1:30080,http://r2:30080``)."""
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    if not urls:
        raise ValueError(f"no router URL in {value!r}")
    return urls


def first_answer(urls: Sequence[str], call: Callable[[str], httpx.Response]) -> httpx.Response:
    """``call(url)`` on each of ``urls`` in turn until one connects (the worker's backends ask
    the routers it registered with); the last transport error when none does."""
    error: httpx.TransportError | None = None
    for url in urls:
        try:
            return call(url)
        except httpx.TransportError as exc:
            error = exc
    if error is None:
        raise ValueError("no router URL")
    raise error


class Registrar:
    """Keeps one worker registered with the router(s) at ``base_url`` until :meth:`stop`."""

    def __init__(
        self,
        base_url: str,
        info: WorkerInfo,
        admin_token: str | None = None,
        heartbeat_interval_s: float = 5.0,
        connect_timeout_s: float = 60.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.base_urls = router_urls(base_url)
        self._current = 0  # the router that answered last
        self.info = info
        token = admin_token if admin_token is not None else os.environ.get(TOKEN_ENV)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client or httpx.Client(timeout=5.0, headers=headers)
        if client is not None and headers:
            self._client.headers.update(headers)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.connect_timeout_s = connect_timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registrations = 0
        self.heartbeats = 0

    @property
    def base_url(self) -> str:
        return self.base_urls[self._current]

    def _send(self, method: str, suffix: str = "", **kw: Any) -> httpx.Response:
        """``method`` on ``/admin/workers{suffix}`` of the first router that answers, from the
        one that answered last; the last transport error when none does."""
        error: httpx.TransportError | None = None
        for step in range(len(self.base_urls)):
            i = (self._current + step) % len(self.base_urls)
            try:
                resp = self._client.request(method, f"{self.base_urls[i]}/admin/workers{suffix}",
                                            **kw)
            except httpx.TransportError as exc:
                error = exc
                continue
            if i != self._current:
                log.warning("router %s does not answer: now talking to %s", self.base_url,
                            self.base_urls[i])
                self._current = i
            return resp
        assert error is not None
        raise error

    def register(self) -> None:
        """POST the record, retrying while the router is unreachable; raise if it refuses."""
        deadline = time.monotonic() + self.connect_timeout_s
        body = encode_worker_info(self.info)
        while True:
            try:
                resp = self._send("POST", content=body,
                                  headers={"Content-Type": "application/json"})
            except httpx.TransportError as exc:
                if time.monotonic() > deadline:
                    raise RegistrationRefused(
                        f"router {', '.join(self.base_urls)} unreachable for "
                        f"{self.connect_timeout_s:.0f} s: {exc}") from exc
                if self._stop.wait(1.0):
                    return
                continue
            if resp.status_code in (200, 201):
                self.registrations += 1
                log.info("registered %s with %s", self.info.worker_id, self.base_url)
                return
            raise RegistrationRefused(
                f"router refused registration of {self.info.worker_id}: HTTP "
                f"{resp.status_code} {resp.text.strip()[:500]}")

    def heartbeat(self) -> None:
        """One heartbeat; re-registers when the router does not know us (404)."""
        resp = self._send("POST", f"/{self.info.worker_id}/heartbeat")
        if resp.status_code == 404:
            log.warning("router forgot %s; registering again", self.info.worker_id)
            self.register()
        elif resp.status_code >= 400:
            log.warning("heartbeat refused: HTTP %s %s", resp.status_code, resp.text[:200])
        else:
            self.heartbeats += 1

    def start_heartbeats(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="radix-global-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval_s):
            try:
                self.heartbeat()
            except (httpx.HTTPError, RegistrationRefused) as exc:  # keep trying: router restarts
                log.warning("heartbeat to %s failed: %s", self.base_url, exc)

    def stop(self, deregister: bool = True) -> None:
        """Stop heartbeats and (by default) ``DELETE`` the registration; never raises."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if deregister and self.registrations:
            try:
                self._send("DELETE", f"/{self.info.worker_id}")
            except httpx.HTTPError as exc:
                log.warning("deregistration of %s failed: %s", self.info.worker_id, exc)
        self._client.close()
