"""Options of the coordination link (``router/coordination/link.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from radix_global.options import opt


@dataclass(frozen=True)
class CoordinationConfig:
    """Several routers, one view (``docs/interfaces.md``, "Several routers, one view").

    Off (this router alone, embedded, as before) unless ``coordination_url`` is set. The URL may
    carry a password (``redis://:PASSWORD@HOST:PORT/DB``): give it through the environment
    (``RADIX_GLOBAL_COORDINATION_URL``) rather than the command line."""

    url: Annotated[str | None, opt(
        "coordination service shared by the cluster's routers (Redis); unset: this router "
        "is alone", aliases=("--coordination",), metavar="redis://HOST:PORT/DB")] = None
    cluster: Annotated[str, opt(
        "cluster name: routers of one cluster share its records (rg:<cluster>:*)")] = "default"
    router_id: Annotated[str | None, opt(
        "this router's id among its peers (default: its host name and port)")] = None
    load_publish_s: Annotated[float, opt(
        "publish this router's in-flight work per slot when it changes, at most this often",
        gt=0)] = 0.02
    unshared_load: Annotated[bool, opt(
        "keep this router's in-flight work to itself (routers over disjoint workers; a test's "
        "negative control): the others price only theirs")] = False
    resync_s: Annotated[float, opt(
        "re-read every shared record this often (a lost change notice costs at most this)",
        gt=0)] = 2.0
    lease_s: Annotated[float, opt(
        "the leader lease (once-per-cluster jobs: profiling, warming, index snapshots)",
        gt=0)] = 10.0
    op_timeout_s: Annotated[float, opt(
        "one call to the service; past it the router routes on its last view", gt=0)] = 0.5

    def __post_init__(self) -> None:
        rid = self.router_id
        if rid is not None and (not rid or len(rid) > 128 or not rid.isprintable()
                                or any(c.isspace() for c in rid)):
            raise ValueError(f"coordination_router_id must be 1-128 printable characters "
                             f"without spaces, got {rid[:140]!r}")
        if self.url is not None and not self.url.startswith(("redis://", "rediss://",
                                                             "unix://")):
            raise ValueError(f"coordination_url must be redis://, rediss:// or unix://, got "
                             f"{self.url.split('@')[-1]!r}")

    @property
    def load_expire_s(self) -> float:
        """A peer's publication counts this long without a refresh (its key's time to live)."""
        return max(20 * self.load_publish_s, 2.0)
