"""SGLang HiCache L3 storage backend over a radix-global :class:`PagePool` (zero-copy v1 API).

SGLang loads it by launch flag (``sglang_patch/launch_server.py`` builds these)::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name":"radix_global_pool","module_path":"sglang_patch.storage",
      "class_name":"RadixGlobalPoolStorage","interface_v1":1,
      "hicache_storage_pass_prefix_keys":true, "namespace":"tiny@abc", "pool_id":"shm-host",
      "pool_capacity_bytes":1073741824, "pool_events_endpoint":"tcp://127.0.0.1:5601"}'

Contract with SGLang (``srt/mem_cache/hicache_storage.py``, ``srt/managers/cache_controller.py``):
``batch_exists(keys, extra_info) -> int`` leading hits; ``batch_get_v1`` / ``batch_set_v1`` move
page ``i`` to/from ``host_indices[i * page_size]`` of the registered host pool and return one bool
per key (SGLang uses the leading run of True). Keys are SGLang's page digests, already seeded by
``cache_salt`` / extra keys, so tenants never share a page; we prefix the model namespace (and the
TP shard) so models never share one either.

Reads are copied straight between the pool's shared memory and the host pool's tensors (no
staging copy for the ``layer_first``, ``page_first``, ``page_first_direct`` and ``page_head``
layouts; other host pools go through SGLang's flat-page helpers). Every store and removal is
published to the index (``pool/events.py``) by TP rank 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from radix_global.types import PageKey
from sglang_patch.pool.aliases import AliasResolver, http_fetch
from sglang_patch.pool.base import PageIO, PagePool, PoolError
from sglang_patch.pool.copy_orders import CopyOrders
from sglang_patch.pool.copy_orders import http_fetch as copy_fetch
from sglang_patch.pool.disk_backend import DiskBackend, DiskWrite
from sglang_patch.pool.disk_tier import DiskTier
from sglang_patch.pool.events import PoolEventPublisher, as_disk, block_removed, run_stores
from sglang_patch.pool.host_pages import bytes_view, page_key_of, page_views
from sglang_patch.pool.load_reports import LoadReporter, http_send
from sglang_patch.pool.opening import open_pool
from sglang_patch.register import TOKEN_ENV

with contextlib.suppress(ImportError):  # registers the CPU host-pool patches (see hicache_cpu)
    from sglang_patch import hicache_cpu  # noqa: F401

log = logging.getLogger(__name__)
DEFAULT_RESYNC_S = 10.0  # a Mooncake read lease is 10 s: probing faster only delays evictions
DEFAULT_RESYNC_PAGES = 256
DEFAULT_DISK_BYTES = 10 << 30


class RadixGlobalPoolStorage(HiCacheStorage):
    """HiCache storage backend: SGLang builds it as ``Cls(storage_config, kwargs)``."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        self.config = dict(storage_config.extra_config or {})
        model = (storage_config.model_name or "model").replace("/", "-")
        self.namespace = str(self.config.get("namespace") or f"{model}@0")
        shard = ""
        if storage_config.tp_size > 1 and not storage_config.is_mla_model:
            shard = f"/tp{storage_config.tp_rank}of{storage_config.tp_size}"
        if storage_config.pp_size > 1:
            shard += f"/pp{storage_config.pp_rank}of{storage_config.pp_size}"
        self._suffix = shard
        # a load is timed on rank 0 for its shard: the router prices the whole token's KV
        self._shards = (storage_config.tp_size if "/tp" in shard else 1) * \
            (storage_config.pp_size if "/pp" in shard else 1)
        self.pool: PagePool | None = None
        self._stop = threading.Event()
        self._resync: threading.Thread | None = None
        self._page_size = 1
        self._publisher: PoolEventPublisher | None = None
        self._aliases: AliasResolver | None = None
        # the persistent tier under the pool (docs/interfaces.md,
        # "The persistent disk tier under the pool")
        self.disk: DiskBackend | None = None
        router = self.config.get("pool_aliases_url")
        # the router answers which salted keys are a shared prefix's (docs/interfaces.md,
        # "Shared platform prefixes across isolated tenants")
        if router:
            self._aliases = AliasResolver(http_fetch(str(router), self.namespace,
                                                     os.environ.get(TOKEN_ENV) or None))
        self._first_rank = storage_config.tp_rank == 0 and storage_config.pp_rank == 0
        self._page_bytes = 0
        # how long loads take, for the router's links (docs/interfaces.md, "Where hosts are")
        self._loads: LoadReporter | None = None
        self._copies: CopyOrders | None = None  # copies the router orders (same section)
        endpoint = self.config.get("pool_events_endpoint")
        if endpoint and self._first_rank:
            self._publisher = PoolEventPublisher(
                str(endpoint), str(self.config.get("pool_events_topic", "kv-events")),
                on_subscribe=self._announce_disk)

    # --- set-up ------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._page_size = int(mem_pool_host.page_size)
        views = page_views(mem_pool_host, 0)
        page_bytes = (sum(v.nbytes for v in views) if views is not None
                      else int(mem_pool_host.get_dummy_flat_data_page().numel()
                               * mem_pool_host.dtype.itemsize))
        self.pool = open_pool(self.config, page_bytes)
        self._page_bytes = page_bytes
        token = os.environ.get(TOKEN_ENV) or None
        loads_url = self.config.get("pool_loads_url")
        if loads_url and self._first_rank:
            self._loads = LoadReporter(self.pool.pool_id, http_send(str(loads_url), token))
        copies_url = self.config.get("pool_copies_url")
        # one shard copies (a tensor-parallel worker's other ranks would not copy theirs); every
        # rank hears the hosts the routers know lost, since each reads its own shard's pages
        copy_in = (self.copy_in if self._first_rank and not self._suffix
                   and hasattr(self.pool, "copy_here") else None)
        told_lost = getattr(self.pool, "told_lost", None)
        if copies_url and (copy_in or told_lost):
            self._copies = CopyOrders(self.namespace, copy_fetch(
                str(copies_url), self.pool.pool_id, token, orders=copy_in is not None),
                copy_in, on_lost=told_lost)
        kv = getattr(mem_pool_host, "kv_buffer", None)
        if isinstance(kv, torch.Tensor) and kv.device.type == "cpu" and kv.is_contiguous():
            self.pool.register_memory(bytes_view(kv))  # large chunks then move without a copy
        log.info("radix-global pool %s: %d pages of %d bytes, namespace %s",
                 self.pool.pool_id, self.pool.capacity_pages, page_bytes, self.namespace)
        if self.config.get("pool_disk"):
            self.disk = DiskBackend(DiskTier(str(self.config["pool_disk"]), int(
                self.config.get("pool_disk_capacity_bytes", DEFAULT_DISK_BYTES))), self._page_size)
            log.info("radix-global disk tier %s: %d pages", self.config["pool_disk"],
                     len(self.disk.disk))
        vanished = getattr(self.pool, "vanished", None)  # pools that evict without telling
        interval = float(self.config.get("pool_resync_s", DEFAULT_RESYNC_S))
        if vanished is not None and self._publisher is not None and interval > 0:
            limit = int(self.config.get("pool_resync_pages", DEFAULT_RESYNC_PAGES))
            self._resync = threading.Thread(target=self._resync_loop,
                                            args=(vanished, interval, limit),
                                            name="radix-global-pool-resync", daemon=True)
            self._resync.start()

    def _pool(self) -> PagePool:
        if self.pool is None:
            raise PoolError("register_mem_pool_host was not called before storage I/O")
        return self.pool

    def pool_key(self, key: str) -> str:
        return f"{self.namespace}/{key}{self._suffix}"

    # --- v1 zero-copy interface ----------------------------------------------------------------

    def _targets(self, keys: list[str], extra_info: Any) -> list[str]:
        """The key each page is stored under: its canonical key for an alias of a registered
        prefix's page (``docs/interfaces.md``, "Shared platform prefixes across isolated tenants"),
        else the key itself."""
        if self._aliases is None or not keys:
            return keys
        prefix = getattr(extra_info, "prefix_keys", None)
        self._aliases.learn(prefix[0] if prefix else keys[0])
        return self._aliases.translate(keys)

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        pool, disk = self._pool(), self.disk
        for i, key in enumerate(self._targets(keys, extra_info)):
            pk = self.pool_key(key)
            if not pool.exists(pk) and not (disk is not None and disk.exists(pk)):
                return i
        return len(keys)

    def _load(self, host: Any, indices: list[int], keys: list[str], targets: list[str],
              events: list[dict[str, Any]]) -> list[bool]:
        """Pages into the host pool: from memory in one batch, each miss from the disk tier
        (then put back into memory). ``keys``: SGLang's (the request's), ``targets``: what
        they are stored under."""
        pool = self._pool()
        chunks: list[Sequence[Any]] = []
        flats: list[torch.Tensor | None] = []  # layouts without a chunk form: via a flat page
        for index in indices:
            views = page_views(host, index)
            if views is None:
                flat = host.get_dummy_flat_data_page()
                views = [bytes_view(flat)]
            else:
                flat = None
            flats.append(flat)
            chunks.append(views)
        stored = [self.pool_key(t) for t in targets]
        started = time.perf_counter()
        loaded = pool.get_many([PageIO(k, c) for k, c in zip(stored, chunks, strict=True)])
        if self._loads is not None and loaded and loaded[0]:  # timed from memory only
            pages = sum(loaded)
            self._loads.add(int(page_key_of(keys[0])), pages,
                            pages * self._page_bytes * self._shards, time.perf_counter() - started)
        for i, ok in enumerate(loaded):
            if not ok and self.disk is not None:
                ok, damaged = self.disk.read_into(stored[i], chunks[i])
                events.extend(damaged)
                if ok:  # the disk holder has it already: only the memory pool's evictions
                    evicted = [PageKey(e.tag) for e in
                               pool.put(stored[i], chunks[i], page_key_of(targets[i])).evicted]
                    if evicted:
                        events.append(self._removed(evicted))
                loaded[i] = ok
            flat = flats[i]
            if ok and flat is not None:
                host.set_from_flat_data_page(indices[i], flat)
        return loaded

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> list[bool]:
        host, targets = self.mem_pool_host, self._targets(keys, extra_info)
        lost: list[PageKey] = []
        read_aliases: list[int] = []  # before the first miss (SGLang keeps only that run)
        events: list[dict[str, Any]] = []
        indices = [int(host_indices[i * self._page_size]) for i in range(len(keys))]
        results = self._load(host, indices, keys, targets, events)
        for i, (key, target, ok) in enumerate(zip(keys, targets, results, strict=True)):
            if not ok:  # batch_exists saw it: evicted or corrupt now
                lost.extend(dict.fromkeys([page_key_of(key), page_key_of(target)]))
            elif target != key and not lost:
                read_aliases.append(i)
        if read_aliases and self._aliases is not None:  # the pool answers for these keys now
            new = set(self._aliases.announce([keys[i] for i in read_aliases]))
            events += self._stores([i for i in read_aliases if keys[i] in new], keys,
                                   extra_info, False, set())
        if lost:
            events.append(self._removed(lost))
        self._publish(events)
        return results

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> list[bool]:
        pool, host = self._pool(), self.mem_pool_host
        targets = self._targets(keys, extra_info)
        results: list[bool] = []
        own: list[int] = []  # pages now in the pool, published on the request's own chain
        canonical: list[int] = []  # a shared prefix's new pages, on its canonical chain
        written_aliases: list[int] = []
        evicted: list[PageKey] = []
        disk_pages: list[DiskWrite | None] = []
        pages: list[PageIO] = []
        for i, target in enumerate(targets):
            index = int(host_indices[i * self._page_size])
            views = page_views(host, index)
            chunks: Sequence[Any] = (views if views is not None else
                                     [bytes_view(host.get_data_page(index, flat=True)
                                                 .contiguous())])
            pages.append(PageIO(self.pool_key(target), chunks, page_key_of(target)))
        for i, (key, target, page, res) in enumerate(zip(keys, targets, pages,
                                                         pool.put_many(pages), strict=True)):
            results.append(res.stored)
            aliased = target != key
            disk_pages.append(DiskWrite(page.key, page.chunks, page_key_of(target),
                                        self._parent_of(i, targets if aliased else keys,
                                                        extra_info, aliased))
                              if self.disk is not None and res.stored else None)
            if not aliased and res.new:
                own.append(i)
            elif aliased and res.stored:
                written_aliases.append(i)
                if res.new:
                    canonical.append(i)
            evicted.extend(PageKey(e.tag) for e in res.evicted)
        if self._aliases is not None and written_aliases:
            new = set(self._aliases.announce([keys[i] for i in written_aliases]))
            own = sorted(own + [i for i in written_aliases if keys[i] in new])
        gone = set(evicted)  # evicted by a later page of this very call: not stored after all
        events = (self._stores(canonical, targets, extra_info, True, gone)
                  + self._stores(own, keys, extra_info, False, gone))
        removals = [self._removed(evicted)] if evicted else []
        if self.disk is not None:  # what is on disk now, on the same two chains
            present, disk_evicted = self.disk.write(disk_pages)
            events += [as_disk(e) for e in self._stores(
                [i for i in sorted(present) if targets[i] != keys[i]], targets, extra_info,
                True, set()) + self._stores(sorted(present), keys, extra_info, False, set())]
            if disk_evicted:
                removals.append(as_disk(self._removed(disk_evicted)))
        self._publish(events + removals)
        return results

    def copy_in(self, keys: list[str]) -> int:
        """Copy the pages ``keys`` (SGLang's, a prefix, root first) into this worker's own
        segment and publish the leading run it holds now; the pages copied."""
        tags = [page_key_of(k) for k in keys]
        copied = self._pool().copy_here([self.pool_key(k) for k in keys], tags)  # type: ignore[attr-defined]
        run = next((i for i, ok in enumerate(copied) if not ok), len(copied))
        if run:
            self._publish(run_stores(tags[:run], lambda i: tags[i - 1] if i else None,
                                     self._page_size))
        return run

    def _parent_of(self, i: int, chain: list[str], extra_info: Any,
                   canonical: bool) -> PageKey | None:
        """The page before page ``i`` of a call on ``chain`` (the call's keys, or their
        canonical keys): the page before it in the call, else the last of SGLang's prefix keys
        (aliased for the canonical chain)."""
        if i > 0:
            return page_key_of(chain[i - 1])
        prefix = getattr(extra_info, "prefix_keys", None)
        if not prefix:
            return None
        if not canonical:
            return page_key_of(prefix[-1])
        last = self._aliases.canonical(prefix[-1]) if self._aliases is not None else None
        return page_key_of(last) if last is not None else None

    def _stores(self, indices: list[int], chain: list[str], extra_info: Any, canonical: bool,
                drop: set[PageKey]) -> list[dict[str, Any]]:
        """The stores of pages ``indices`` of ``chain`` (``drop``: pages to leave out)."""
        chosen = set(indices)
        tags = [t if i in chosen and t not in drop else None
                for i, t in enumerate(page_key_of(k) for k in chain)]
        return run_stores(tags, lambda i: self._parent_of(i, chain, extra_info, canonical),
                          self._page_size)

    def _announce_disk(self) -> None:
        """A subscriber joined the pool stream: what the disk tier holds of this namespace."""
        if self.disk is not None and self._publisher is not None:
            for batch in self.disk.announcement(self.namespace, self._suffix):
                self._publisher.publish(batch)

    def _removed(self, pages: list[PageKey]) -> dict[str, Any]:
        """The removal of ``pages``, with every alias key this process knows of them."""
        if self._aliases is not None:
            extra = [a for p in pages for a in self._aliases.aliases_of(p)]
            self._aliases.forget_announced(extra)
            pages = list(dict.fromkeys([*pages, *(page_key_of(a) for a in extra)]))
        return block_removed(pages)

    def _resync_loop(self, vanished: Any, interval_s: float, limit: int) -> None:
        """Every ``interval_s``: the pages the pool lost silently (evicted by the store) leave
        the index, at most ``limit`` probed per round (``docs/interfaces.md``,
        "Mooncake Store as the L3 pool")."""
        while not self._stop.wait(interval_s):
            try:
                gone = vanished(limit)
            except Exception:  # the store is unreachable for now: try again next round
                log.exception("radix-global: pool resync failed")
                continue
            if gone:
                log.info("radix-global: %d pool pages were evicted by the store", len(gone))
                self._publish([self._removed([PageKey(t) for t in gone])])

    def _publish(self, events: list[dict[str, Any]]) -> None:
        if self._publisher is not None and events:
            try:
                self._publisher.publish(events)
            except Exception:  # the index resyncs on a gap; never fail the engine's I/O
                log.exception("radix-global: publishing pool events failed")

    # --- legacy (non-v1) interface, required by the ABC -------------------------------------------

    def exists(self, key: str) -> bool:
        return self._pool().exists(self.pool_key(key))

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        if target_location is None:
            return None
        ok = self._pool().get_into(self.pool_key(key), [bytes_view(target_location)])
        return target_location if ok else None

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[Any]:
        targets = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets, strict=True)]

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        if value is None:
            return False
        tag = page_key_of(key)
        return self._pool().put(self.pool_key(key), [bytes_view(value.contiguous())], tag).stored

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        return all(self.set(k, v) for k, v in zip(keys, values or [], strict=True))

    def clear(self) -> None:
        """SGLang's ``POST /hicache/storage-backend/clear``: the whole shared pool (its pages
        cannot be told apart by namespace) and its disk tier are emptied, and the index is told
        what left."""
        tags = self._pool().clear()
        events = [self._removed([PageKey(t) for t in tags])] if tags else []
        self._publish(events + (self.disk.clear() if self.disk is not None else []))

    def get_stats(self) -> Any:
        return None  # SGLang expects its StorageMetrics type here; see pool_stats()

    def pool_stats(self) -> Any:
        return None if self.pool is None else self.pool.stats()

    def close(self) -> None:
        self._stop.set()
        if self._resync is not None:
            self._resync.join(timeout=5.0)
        if self._copies is not None:  # before the publisher: a copy publishes
            self._copies.close()
        if self._loads is not None:
            self._loads.close()
        if self._publisher is not None:
            self._publisher.close()
        if self.pool is not None:
            self.pool.close()
