"""Which ZMQ endpoints the index can subscribe to. Pure: no sockets.

A worker registers its KV-event (and replay, pool-event) endpoints; the subscriber connects a SUB
(a DEALER for replays) to each, one per dp rank, rank ``r`` at tcp port + ``r`` or ipc/inproc name
+ ``_dp<r>`` (``subscriber.offset_endpoint``). A record whose endpoint cannot be connected for
every rank is refused at registration (``docs/interfaces.md`` section 2), so "registered" never
hides "cannot be followed".
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

# A host to connect to: a name, an IPv4 address or an IPv6 one (bracketed or not). Not "*": that
# is a bind address (SGLang's default ``tcp://*:5557``), which ZMQ cannot connect to.
_TCP = re.compile(r"tcp://(?P<host>\[[0-9A-Fa-f:.%]+\]|[A-Za-z0-9._:%-]+):(?P<port>[0-9]{1,5})")
IPC_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes with the terminating NUL


def endpoint_problem(endpoint: str, ranks: int = 1) -> str | None:
    """Why a ZMQ SUB could not connect to ``endpoint`` for dp ranks ``0..ranks-1``; None when it
    can. ``tcp://HOST:PORT`` needs a real host and ``PORT + ranks - 1 <= 65535``; ``ipc://PATH``
    a path that fits a socket address with its ``_dp<r>`` suffix; ``inproc://NAME`` a name."""
    if not endpoint.isprintable():
        return "contains a control character"
    if endpoint.startswith("tcp://"):
        m = _TCP.fullmatch(endpoint)
        if m is None:
            return "must be tcp://HOST:PORT with a host to connect to (not '*')"
        port = int(m["port"])
        if not 1 <= port <= 65536 - ranks:
            return f"port {port} (+ {ranks - 1} dp ranks) is outside [1, 65535]"
        return None
    if endpoint.startswith(("ipc://", "inproc://")):
        name = endpoint.split("://", 1)[1]
        if not name:
            return "names no socket"
        suffix = len(f"_dp{ranks - 1}") if ranks > 1 else 0
        if endpoint.startswith("ipc://") and len(name.encode()) + suffix > IPC_PATH_MAX:
            return f"ipc path (with its _dp<rank> suffix) longer than {IPC_PATH_MAX} bytes"
        return None
    return "must be tcp://HOST:PORT, ipc://PATH or inproc://NAME"


_HOST_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "*"})


def is_host_local(address: str) -> bool:
    """Whether ``address`` (an ``http(s)://`` URL or a ZMQ endpoint) can be reached only from the
    host that names it: a loopback or wildcard host, or an ``ipc://`` / ``inproc://`` socket.
    Such an address is fine from a worker on the router's own host, and useless from any other
    (``docs/interfaces.md`` section 12)."""
    if address.startswith(("ipc://", "inproc://")):
        return True
    try:
        host = urlsplit(address).hostname
    except ValueError:
        return False  # unparseable: endpoint_problem / the URL check say why
    if host is None:
        return False
    if host.lower() in _HOST_LOCAL_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: only its resolver knows, and it may well be remote
    return ip.is_loopback or ip.is_unspecified
