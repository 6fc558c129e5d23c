"""Ports handed out now for a process to bind later: the launch wrapper's event sockets, and
the servers of tests and benchmarks.

They come from below the kernel's ephemeral range, which ``bind(0)`` and every outgoing
``connect()`` draw from: a port chosen there can be taken by any connection in the seconds
before an engine's child process binds it (a CI run lost a KV-event replay port that way).
SGLang picks its own such ports in 22000-29999 for the same reason; ours stay apart.
"""

from __future__ import annotations

import collections
import random
import socket
from pathlib import Path

LATER_BIND_PORTS = (30100, 32767)
_rng = random.Random()
_handed: collections.deque[int] = collections.deque(maxlen=512)  # not twice in a row


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, for its user to bind later (that race remains, but only with
    other explicit binds). Falls back to a kernel-chosen port when the range is unusable."""
    low, high = LATER_BIND_PORTS
    high = min(high, _ephemeral_low() - 1)
    if high - low >= 64:
        for port in _rng.sample(range(low, high + 1), 64):
            if port in _handed:
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _handed.append(port)
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def endpoint_taken(endpoint: str) -> bool:
    """Whether some process holds the port of ``endpoint`` (``tcp://host:port``) now: binding
    it fails. Not a reservation: the answer can change the moment after."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return True
    return False
