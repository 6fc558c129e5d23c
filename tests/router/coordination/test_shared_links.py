"""What a router does with its peers' measured links (``router/coordination/bridge.py``
``SharedView.links_seen``): handed to the topology, taken back when gone, bounded."""

from __future__ import annotations

import time

import pytest

from router.coordination import bridge
from router.coordination.bridge import SharedView
from router.coordination.reader import Reader
from router.coordination.records import Kind, RecordError, encode, link_record
from router.routing.link_fit import LinkStats
from router.routing.load_view import PeerLoads

LINKS = {("a", "b"): LinkStats(4, 4.0, 4.0, 4.0, 4.0, 4.0)}


class Sink:
    def __init__(self) -> None:
        self.shared: dict[str, object] = {}

    def own_links(self) -> dict:
        return {}

    def share(self, router: str, links: dict) -> None:
        self.shared[router] = links

    def unshare(self, router: str) -> None:
        self.shared.pop(router, None)


def view(sink: Sink | None) -> SharedView:
    return SharedView(None, None, lambda name: None, lambda e, c: None,  # type: ignore[arg-type]
                      time.monotonic, 10.0, sink)


def test_peers_links_reach_the_topology_and_leave_when_a_complete_read_misses_them():
    sink = Sink()
    shared = view(sink)
    shared.links_seen("r1", LINKS)
    shared.links_seen("r2", LINKS)
    assert set(sink.shared) == {"r1", "r2"}
    shared.present(Kind.LINK, {"r2"})
    assert set(sink.shared) == {"r2"}
    shared.links_gone("r2")
    assert sink.shared == {}


def test_links_of_more_routers_than_the_bound_are_refused(monkeypatch):
    monkeypatch.setattr(bridge, "MAX_LINK_ROUTERS", 2)
    sink = Sink()
    shared = view(sink)
    shared.links_seen("r1", LINKS)
    shared.links_seen("r2", LINKS)
    with pytest.raises(RecordError, match="already 2"):
        shared.links_seen("r3", LINKS)
    shared.links_seen("r2", LINKS)  # a router already counted updates its links
    assert set(sink.shared) == {"r1", "r2"}


def test_without_a_topology_nothing_is_taken():
    shared = view(None)
    shared.links_seen("r1", LINKS)
    assert shared.taken_links == set()


def test_a_peer_whose_record_turns_unreadable_stops_counting():
    """Its key is still listed, so no complete read would take its last good sums out."""
    sink = Sink()
    shared = view(sink)
    reader = Reader("me", shared, PeerLoads(10.0), time.monotonic)
    good = encode(link_record("r1", LINKS))
    reader.apply(Kind.LINK, "r1", good)
    reader.apply(Kind.LINK, "me", encode(link_record("me", LINKS)))  # its own: not applied
    assert set(sink.shared) == {"r1"}
    reader.apply(Kind.LINK, "r1", b"not json")
    assert sink.shared == {} and reader.refused["link"] == 1
