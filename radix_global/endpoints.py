"""Which ZMQ endpoints the index can subscribe to. Pure: no sockets.

A worker registers its KV-event (and replay, pool-event) endpoints; the subscriber connects a SUB
(a DEALER for replays) to each, one per dp rank, rank ``r`` at tcp port + ``r`` or ipc/inproc name
+ ``_dp<r>`` (``subscriber.offset_endpoint``). A record whose endpoint cannot be connected for
every rank is refused at registration (``docs/interfaces.md`` section "Worker registration"), so
"registered" never hides "cannot be followed".
"""

from __future__ import annotations

import ipaddress
import re
import socket
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


_HOST_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "localhost6",
                               "localhost6.localdomain6", "ip6-localhost", "ip6-loopback", "*"})


def is_loopback_address(host: str) -> bool:
    """Whether ``host`` (an address or a name) means this host itself: a loopback or wildcard
    address in any spelling the C resolver accepts (``127.1``, ``0``, ``2130706433``,
    ``0x7f000001``, ``::ffff:127.0.0.1``, a trailing dot) or a loopback name. Names are not
    resolved: one that resolves to loopback only on some host is taken as a remote name."""
    host = host.strip("[]").rstrip(".").lower()
    if host in _HOST_LOCAL_NAMES or host.endswith(".localhost"):
        return True
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host)
    except ValueError:
        try:  # the shorthand IPv4 forms inet_aton (and so connect()) accepts
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def is_host_local(address: str) -> bool:
    """Whether ``address`` (an ``http(s)://`` URL or a ZMQ endpoint) can be reached only from the
    host that names it: a loopback or wildcard host (:func:`is_loopback_address`), or an
    ``ipc://`` / ``inproc://`` socket. Such an address is fine from a worker on the router's
    own host, and useless from any other (``docs/interfaces.md`` section "Across hosts")."""
    if address.startswith(("ipc://", "inproc://")):
        return True
    try:
        host = urlsplit(address).hostname
    except ValueError:
        return False  # unparseable: endpoint_problem / the URL check say why
    return host is not None and is_loopback_address(host)
