"""A real Redis server for tests (Debian's ``redis-server``, installed by the bootstrap): no
persistence, on a Unix socket of the test's own (or a TCP address given), killed with -9 and
restarted empty by the tests that need the coordination service to fail."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis


class RedisServer:
    def __init__(self, folder: Path, host: str | None = None, port: int = 0,
                 netns: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: run scripts/bootstrap.sh (it installs "
                               "Debian's redis-server)")
        self.binary, self.folder, self.netns = binary, folder, netns
        self.host, self.port = host, port
        self.socket = folder / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.host is not None:
            return f"redis://{self.host}:{self.port}/0"
        return f"unix://{self.socket}"

    def client(self) -> redis.Redis:
        if self.host is not None:
            return redis.Redis(host=self.host, port=self.port, socket_timeout=2)
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=2)

    def start(self) -> RedisServer:
        argv = [self.binary, "--save", "", "--appendonly", "no", "--dir", str(self.folder),
                "--logfile", str(self.folder / "redis.log")]
        if self.host is None:
            argv += ["--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        else:
            argv += ["--port", str(self.port), "--bind", self.host, "--protected-mode", "no"]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    return self
            except redis.RedisError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start: {self._log_tail()}")
            time.sleep(0.02)

    def kill(self) -> None:
        """kill -9: no goodbye to clients, and (no persistence) every record lost."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def _log_tail(self) -> str:
        log = self.folder / "redis.log"
        return log.read_text()[-2000:] if log.exists() else "(no log)"
