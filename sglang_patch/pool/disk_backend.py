"""The disk tier as the HiCache storage backend drives it (``docs/interfaces.md``,
"The persistent disk tier under the pool"): write through, read on a memory miss, and the events
that tell the index about the disk holder.

The backend (``sglang_patch/storage.py``) hands over pages it already stored in the memory pool,
with their pool keys and tags; this module owns the disk side and never touches the memory pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from radix_global.types import PageKey
from sglang_patch.pool.disk_format import DiskPage
from sglang_patch.pool.disk_tier import DiskTier
from sglang_patch.pool.events import DISK_MEDIUM, block_removed, block_stored
from sglang_patch.pool.host_pages import page_key_of

ANNOUNCE_BATCH = 512  # events per message when announcing the tier to a new subscriber


class DiskWrite(NamedTuple):
    """One page of a ``batch_set`` for the disk: what to write and where its chain goes."""

    pool_key: str
    chunks: Sequence[object]
    tag: PageKey
    parent: PageKey | None  # the page before it on disk (None: the chain's first)


class DiskBackend:
    """A :class:`DiskTier` plus the backend's rules for it."""

    def __init__(self, disk: DiskTier, page_size: int) -> None:
        self.disk, self.page_size = disk, page_size

    def exists(self, pool_key: str) -> bool:
        return self.disk.exists(pool_key)

    def read_into(self, pool_key: str, views: Sequence[object]
                  ) -> tuple[bool, list[dict[str, Any]]]:
        """The page from disk (a memory-pool miss), and the removal to publish when the file
        was there but damaged."""
        on_disk = self.disk.exists(pool_key)
        if self.disk.read_into(pool_key, views):
            return True, []
        if not on_disk:
            return False, []
        return False, [block_removed([page_key_of(pool_key.split("/")[1])], DISK_MEDIUM)]

    def write(self, pages: Sequence[DiskWrite | None]) -> tuple[set[int], list[PageKey]]:
        """Write a call's pages through (None: a page the memory pool did not take). Which of
        them are on disk now (those a later page of the call evicted left out), and the tags
        of every page evicted to make room."""
        on_disk: dict[int, PageKey] = {}
        evicted: list[PageKey] = []
        for i, p in enumerate(pages):
            if p is None:
                continue
            res = self.disk.write(p.pool_key, p.chunks, p.tag, p.parent, self.page_size)
            if res.on_disk:
                on_disk[i] = p.tag
            evicted.extend(PageKey(t) for t in res.evicted)
        gone = set(evicted)
        return {i for i, tag in on_disk.items() if tag not in gone}, evicted

    def clear(self) -> list[dict[str, Any]]:
        tags = [PageKey(t) for t in self.disk.clear()]
        return [block_removed(tags, DISK_MEDIUM)] if tags else []

    def announcement(self, namespace: str, suffix: str) -> list[list[dict[str, Any]]]:
        """The disk's pages of ``namespace`` (and this rank's shard ``suffix``) as stores on the
        disk holder, parents first, in batches; a page whose parent is not on disk is left out
        (no leading run reaches it)."""
        mine = [p for p in self.disk.pages() if _ours(p, namespace, suffix, self.page_size)]
        children: dict[int | None, list[DiskPage]] = {}
        for p in mine:
            children.setdefault(p.parent, []).append(p)
        events: list[dict[str, Any]] = []
        frontier = list(children.get(None, []))
        seen: set[int] = set()
        while frontier:
            page = frontier.pop()
            if page.tag in seen:
                continue
            seen.add(page.tag)
            events.append(block_stored([PageKey(page.tag)],
                                       None if page.parent is None else PageKey(page.parent),
                                       self.page_size, DISK_MEDIUM))
            frontier.extend(children.get(page.tag, []))
        return [events[i : i + ANNOUNCE_BATCH] for i in range(0, len(events), ANNOUNCE_BATCH)]


def _ours(page: DiskPage, namespace: str, suffix: str, page_size: int) -> bool:
    rest = page.key[len(namespace) + 1:] if page.key.startswith(namespace + "/") else ""
    return (page.page_size == page_size and len(rest) == 64 + len(suffix)
            and rest.endswith(suffix))
