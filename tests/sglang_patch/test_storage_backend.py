"""The SGLang HiCache storage backend over the shm pool, driven directly (no server).

SGLang can only be imported after the CPU patches, which change ``sys.modules``; so each check
runs in a fresh spawned interpreter (``_isolated``) and the pytest process stays clean. The host
pool is SGLang's layout-first buffer shape built as a plain tensor (``_HostPool``), which is all
the backend touches: ``layout``, ``page_size``, ``kv_buffer``, ``dtype``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import traceback
import uuid

import pytest

pytestmark = pytest.mark.sglang

PAGE_SIZE, LAYERS, HEADS, DIM, SLOTS = 4, 3, 2, 8, 64


def _isolated(fn, *args) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_runner, args=(fn, args, q))
    p.start()
    ok, detail = q.get(timeout=240)
    p.join(timeout=30)
    assert ok, detail


def _runner(fn, args, q) -> None:
    try:
        from sglang_patch import cpu_compat, hicache_cpu  # noqa: F401

        cpu_compat.apply("cpu")
        fn(*args)
        q.put((True, ""))
    except BaseException:
        q.put((False, traceback.format_exc()))


class _HostPool:
    def __init__(self, layout: str = "layer_first", seed: int = 0):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.layout, self.page_size, self.dtype = layout, PAGE_SIZE, torch.bfloat16
        shape = (2, LAYERS, SLOTS, HEADS, DIM) if layout == "layer_first" else (
            2, SLOTS, LAYERS, HEADS, DIM)
        self.kv_buffer = torch.randn(shape, generator=g).to(torch.bfloat16)


def _backend(pool_id: str, tp: tuple[int, int] = (0, 1), **extra):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    from sglang_patch.storage import RadixGlobalPoolStorage

    cfg = HiCacheStorageConfig(tp_rank=tp[0], tp_size=tp[1], pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                               is_page_first_layout=False, model_name="tiny",
                               extra_config={"pool_id": pool_id, "namespace": "tiny@1",
                                             "pool_capacity_bytes": 1 << 20, **extra})
    return RadixGlobalPoolStorage(cfg, {})


def _page(host, index):
    if host.layout == "layer_first":
        return host.kv_buffer[:, :, index : index + PAGE_SIZE].clone()
    return host.kv_buffer[:, index : index + PAGE_SIZE].clone()


def _check_roundtrip(pool_id: str, layout: str, endpoint: str) -> None:
    import torch
    import zmq

    from radix_global.events import EventDecoder
    from radix_global.ops import StorePages
    from radix_global.types import Namespace, PoolId, Tier

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    writer = _backend(pool_id, pool_events_endpoint=endpoint)
    sub.connect(endpoint)
    src = _HostPool(layout, seed=1)
    writer.register_mem_pool_host(src)
    keys = [f"{i:02x}" * 32 for i in range(1, 4)]
    host_idx = torch.arange(8, 8 + 3 * PAGE_SIZE)
    import time

    time.sleep(0.3)  # PUB/SUB join
    assert writer.batch_set_v1(keys, host_idx) == [True] * 3

    reader = _backend(pool_id)  # another worker: same pool, same namespace
    dst = _HostPool(layout, seed=2)
    reader.register_mem_pool_host(dst)
    assert reader.batch_exists([*keys, "ff" * 32]) == 3
    assert reader.batch_get_v1(keys, torch.arange(40, 40 + 3 * PAGE_SIZE)) == [True] * 3
    for i in range(3):
        assert torch.equal(_page(dst, 40 + i * PAGE_SIZE), _page(src, 8 + i * PAGE_SIZE))

    other = _backend(pool_id, namespace="other-model@1")
    other.register_mem_pool_host(_HostPool(layout))
    assert other.batch_exists(keys) == 0  # namespaces never share pages

    assert sub.poll(2000)
    _topic, seq, payload = sub.recv_multipart()
    assert int.from_bytes(seq, "big") == 0
    ops = EventDecoder(PoolId(pool_id), Namespace("tiny@1"), PAGE_SIZE).decode(payload).ops
    assert len(ops) == 1 and isinstance(ops[0], StorePages)
    assert ops[0].location.tier == Tier.POOL and ops[0].parent is None
    from sglang_patch.storage import page_key_of

    assert ops[0].keys == [page_key_of(k) for k in keys]

    # SGLang's /clear_hicache_storage_backend: the pool empties and the index hears of it.
    from radix_global.ops import RemovePages

    writer.clear()
    assert reader.batch_exists(keys) == 0
    assert sub.poll(2000)
    _topic, seq, payload = sub.recv_multipart()
    ops = EventDecoder(PoolId(pool_id), Namespace("tiny@1"), PAGE_SIZE).decode(payload).ops
    assert len(ops) == 1 and isinstance(ops[0], RemovePages)
    assert sorted(ops[0].keys) == sorted(page_key_of(k) for k in keys)


def _check_loads_are_timed_for_the_router(pool_id: str) -> None:
    """docs/interfaces.md, "Where hosts are": each batch read from memory is reported with its
    first page's key (the request's), pages, bytes and seconds; a batch whose first page misses
    is not."""
    import torch

    from radix_global.pool_loads import PoolLoadReport
    from sglang_patch.storage import page_key_of

    writer = _backend(pool_id)
    writer.register_mem_pool_host(_HostPool())
    keys = [f"{i:02x}" * 32 for i in range(30, 33)]
    assert writer.batch_set_v1(keys, torch.arange(0, 3 * PAGE_SIZE)) == [True] * 3
    reader = _backend(pool_id, pool_loads_url="http://127.0.0.1:9")
    reader.register_mem_pool_host(_HostPool())
    assert writer._loads is None and reader._loads is not None
    sent: list[bytes] = []
    reader._loads._send = sent.append
    assert reader.batch_get_v1(keys, torch.arange(8, 8 + 3 * PAGE_SIZE)) == [True] * 3
    assert reader.batch_get_v1(["ee" * 32, *keys], torch.arange(8, 8 + 4 * PAGE_SIZE))[0] is False
    reader._loads.flush()
    import msgspec

    loads = [x for body in sent for x in msgspec.json.decode(body, type=PoolLoadReport).loads]
    page_bytes = 2 * LAYERS * PAGE_SIZE * HEADS * DIM * 2  # K and V, bfloat16
    assert [(x.first, x.pages, x.bytes) for x in loads] == [
        (page_key_of(keys[0]), 3, 3 * page_bytes)]
    assert 0 < loads[0].seconds < 10
    writer.close()
    reader.close()


def _check_corrupt_is_miss(pool_id: str) -> None:
    import torch

    writer = _backend(pool_id)
    writer.register_mem_pool_host(_HostPool(seed=3))
    key = "ab" * 32
    writer.batch_set_v1([key], torch.arange(0, PAGE_SIZE))
    path, off, _ = writer.pool.locate(writer.pool_key(key))
    with open(path, "r+b") as fh:
        fh.seek(off + 5)
        fh.write(b"\x7f")
    reader = _backend(pool_id)
    reader.register_mem_pool_host(_HostPool(seed=4))
    assert reader.batch_exists([key]) == 1
    assert reader.batch_get_v1([key], torch.arange(0, PAGE_SIZE)) == [False]
    assert reader.batch_exists([key]) == 0


def _check_resync_publishes_what_the_store_lost(pool_id: str, endpoint: str) -> None:
    """A pool that loses pages silently (a Mooncake Store evicting at its watermark) reports
    them through ``vanished``; the backend's resync thread tells the index (BlockRemoved)."""
    import zmq

    from radix_global.events import EventDecoder
    from radix_global.ops import RemovePages
    from radix_global.types import Namespace, PageKey, PoolId
    from sglang_patch import storage

    rounds = [[1234, -5], []]
    real = storage.open_pool

    def losing_pool(config, page_bytes):
        pool = real(config, page_bytes)
        pool.vanished = lambda limit: rounds.pop(0) if rounds else []
        return pool

    storage.open_pool = losing_pool
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    backend = _backend(pool_id, pool_events_endpoint=endpoint, pool_resync_s=0.2)
    sub.connect(endpoint)
    try:
        backend.register_mem_pool_host(_HostPool())
        assert sub.poll(5000), "no resync event"
        _topic, _seq, payload = sub.recv_multipart()
        ops = EventDecoder(PoolId(pool_id), Namespace("tiny@1"), PAGE_SIZE).decode(payload).ops
        assert len(ops) == 1 and isinstance(ops[0], RemovePages)
        assert ops[0].keys == [PageKey(1234), PageKey(-5)]
    finally:
        backend.close()
        storage.open_pool = real


def _check_cpu_hicache_patches() -> None:
    """The CPU patches (sglang_patch/hicache_cpu.py) are installed and do what SGLang needs."""
    import torch
    from sglang.srt.mem_cache.pool_host import base, common, mha

    from sglang_patch import hicache_cpu

    buf = common.ALLOC_MEMORY_FUNCS["cpu"]((2, 3), dtype=torch.float32, device="cpu",
                                           pin_memory=False, allocator=None)
    assert buf.shape == (2, 3) and buf.device.type == "cpu"
    assert base.HICACHE_HOST_MEMORY_RESERVE_BYTES == hicache_cpu.CPU_HOST_RESERVE_BYTES
    src = [torch.arange(40.0).reshape(10, 4), -torch.arange(40.0).reshape(10, 4)]
    dst = [torch.zeros(6, 4), torch.zeros(6, 4)]
    mha.transfer_kv_direct(src_layers=src, dst_layers=dst, src_indices=torch.tensor([8, 9]),
                           dst_indices=torch.tensor([0, 5]), page_size=2)
    assert torch.equal(dst[0][5], src[0][9]) and torch.equal(dst[1][0], src[1][8])
    assert torch.equal(dst[0][1], torch.zeros(4))
    # a host pool on CPU is unpinned: its L3 staging pages are allocatable (SGLang's file backend)
    host = mha.MHATokenToKVPoolHost.__new__(mha.MHATokenToKVPoolHost)
    with contextlib.suppress(Exception):  # only the base constructor's first lines matter here
        base.HostKVCache.__init__(
            host, dtype=torch.float32, device_capacity_tokens=16, size_per_token=8,
            start_layer=0, end_layer=1, host_to_device_ratio=2.0, host_size=0, page_size=4,
            layout="layer_first", pin_memory=True, device="cpu")
    assert host.pin_memory is False


def _check_shared_prefix_aliases(pool_id: str, endpoint: str) -> None:
    """Tenants A and B with one registered prefix P (3 pages): A's write stores P under its
    canonical keys, B's backend finds and reads those pages through its own salted keys and
    writes no second copy, B never finds A's own page, and the index hears P's pages on their
    canonical chain and each tenant's alias keys on its own. Without aliases B finds nothing
    (the negative control)."""
    import time

    import torch
    import zmq

    from radix_global.aliases import alias_pairs
    from radix_global.events import EventDecoder
    from radix_global.keys import page_digests
    from radix_global.types import Namespace, PoolId
    from sglang_patch.pool.aliases import AliasResolver
    from sglang_patch.storage import page_key_of

    prefix = list(range(100, 100 + 3 * PAGE_SIZE))
    answers = {}
    for salt in ("tenant:a", "tenant:b"):
        pairs = alias_pairs(prefix, PAGE_SIZE, salt)
        answers[pairs[0].salted] = [list(p) for p in pairs]

    def chain(tokens, salt):
        return [d.hex() for d in page_digests(tokens, PAGE_SIZE, cache_salt=salt)]

    def aliasing(backend):
        backend._aliases = AliasResolver(lambda head: {"pairs": answers.get(head, [])})
        return backend

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    a = aliasing(_backend(pool_id, pool_events_endpoint=endpoint))
    sub.connect(endpoint)
    a.register_mem_pool_host(_HostPool(seed=5))
    time.sleep(0.3)  # PUB/SUB join
    a_keys = chain(prefix + [7] * PAGE_SIZE, "tenant:a")
    assert a.batch_set_v1(a_keys, torch.arange(0, 4 * PAGE_SIZE)) == [True] * 4
    canonical = [p.canonical for p in alias_pairs(prefix, PAGE_SIZE, "tenant:a")]
    assert all(a.pool.exists(a.pool_key(c)) for c in canonical)
    assert not any(a.pool.exists(a.pool_key(k)) for k in a_keys[:3])  # no salted copy
    stores = a.pool.stats().stores

    b = aliasing(_backend(pool_id))
    b.register_mem_pool_host(_HostPool(seed=6))
    b_keys = chain(prefix + [7] * PAGE_SIZE, "tenant:b")  # A's exact request, as B
    assert b.batch_exists(b_keys) == 3  # P only, never A's page
    assert b.batch_get_v1(b_keys[:3], torch.arange(16, 16 + 3 * PAGE_SIZE)) == [True] * 3
    for i in range(3):
        assert torch.equal(_page(b.mem_pool_host, 16 + i * PAGE_SIZE),
                           _page(a.mem_pool_host, i * PAGE_SIZE))
    assert b.batch_set_v1(b_keys[:3], torch.arange(16, 16 + 3 * PAGE_SIZE)) == [True] * 3
    assert b.pool.stats().stores == stores  # the second tenant stored no second copy

    plain = _backend(pool_id)  # the negative control: the same backend without aliases
    plain.register_mem_pool_host(_HostPool(seed=6))
    assert plain.batch_exists(b_keys) == 0

    decoder = EventDecoder(PoolId(pool_id), Namespace("tiny@1"), PAGE_SIZE)
    assert sub.poll(2000)
    ops = decoder.decode(sub.recv_multipart()[2]).ops
    assert [(op.parent, op.keys) for op in ops] == [
        (None, [page_key_of(c) for c in canonical]), (None, [page_key_of(k) for k in a_keys])]
    for backend in (a, b, plain):
        backend.close()


def _check_mooncake_pages_move_in_one_call() -> None:
    """Over a Mooncake pool (a fake client, shared by two backends as one store is), the backend
    registers the host pool's KV buffer (for zero-copy moves of large chunks), and a batch of
    layer_first pages moves in one call each way, bit-exactly; a page that fails its checksum
    is a miss."""
    import torch
    from fake_mooncake import FakeStore

    from sglang_patch.pool import mooncake_pool

    objects: dict[str, bytes] = {}
    stores: list[FakeStore] = []

    def factory(read_stall_s: float = 0.0) -> FakeStore:
        stores.append(FakeStore(objects))
        return stores[-1]

    mooncake_pool.mooncake_store = factory
    extra = {"pool": "mooncake", "mooncake_master": "m:1", "pool_capacity_bytes": 16 << 20}
    writer, reader = _backend("mooncake-w", **extra), _backend("mooncake-r", **extra)
    src, dst = _HostPool(seed=7), _HostPool(seed=8)
    writer.register_mem_pool_host(src)
    reader.register_mem_pool_host(dst)
    keys = [f"{i:02x}" * 32 for i in range(20, 24)]
    assert writer.batch_set_v1(keys, torch.arange(0, 4 * PAGE_SIZE)) == [True] * 4
    assert stores[0].batch_calls == 1
    assert len(stores[0].regions) == 3  # staging slots, checksum slots, the host KV buffer
    bad = bytearray(objects[writer.pool_key(keys[3])])
    bad[0] ^= 0x01
    objects[writer.pool_key(keys[3])] = bytes(bad)
    got = reader.batch_get_v1(keys, torch.arange(32, 32 + 4 * PAGE_SIZE))
    assert got == [True, True, True, False] and stores[1].batch_calls == 1
    for i in range(3):
        assert torch.equal(_page(dst, 32 + i * PAGE_SIZE), _page(src, i * PAGE_SIZE))
    # a copy order (docs/interfaces.md, "Where hosts are"): the reader copies the
    # prefix onto its own segment and publishes what it holds now, parents in order
    published: list[list[dict]] = []
    reader._publish = published.append
    copy = [*keys[:2], "ee" * 32, keys[2]]  # the third page is not in the store: the run ends
    assert reader.copy_in(copy) == 2
    assert stores[1].copies == [(reader.pool_key(k), ["10.0.0.2:15000"]) for k in keys[:3]]
    from sglang_patch.storage import page_key_of

    (events,) = published
    assert [(e["block_hashes"], e["parent_block_hash"]) for e in events] == [
        ([page_key_of(keys[0]), page_key_of(keys[1])], None)]
    # a tensor-parallel rank other than the first copies nothing but hears the hosts the
    # routers know lost: it reads its own shard ("Reads around a lost host")
    from sglang_patch import storage
    from sglang_patch.pool.copy_orders import Answer

    order = {"namespace": "tiny@1", "keys": keys[:1]}
    asked: list[bool] = []

    def fetch(url, pool_id, token, orders=True):
        asked.append(orders)
        return lambda: Answer([order], ["10.0.0.9"])

    storage.copy_fetch = fetch
    ranked = _backend("mooncake-t", tp=(1, 2), pool_copies_url="http://r:1", **extra)
    ranked.register_mem_pool_host(_HostPool(seed=9))
    assert ranked._copies is not None and ranked._copies.poll() == 0
    assert ranked.pool.lost_hosts() == ["10.0.0.9"] and stores[-1].copies == []
    assert asked == [False]  # it leaves the orders to the rank that copies
    for backend in (writer, reader, ranked):
        backend.close()


def _all_checks(prefix: str, port: int) -> None:
    _check_cpu_hicache_patches()
    _check_roundtrip(f"{prefix}-lf", "layer_first", f"tcp://127.0.0.1:{port}")
    _check_roundtrip(f"{prefix}-pf", "page_first", f"tcp://127.0.0.1:{port + 1}")
    _check_corrupt_is_miss(f"{prefix}-bad")
    _check_loads_are_timed_for_the_router(f"{prefix}-ld")
    _check_resync_publishes_what_the_store_lost(f"{prefix}-rs", f"tcp://127.0.0.1:{port + 2}")
    _check_shared_prefix_aliases(f"{prefix}-al", f"tcp://127.0.0.1:{port + 3}")
    _check_mooncake_pages_move_in_one_call()


def test_backend_moves_pages_publishes_events_and_rejects_corruption():
    """One spawned interpreter (importing SGLang costs ~30 s) runs: pages written by one backend
    are read bit-exactly by another (layer_first and page_first host layouts), another namespace
    sees none of them, the index decoder turns the published batch into a POOL StorePages with
    the right PageKeys, a corrupted page is a miss that disappears from batch_exists, and what
    a pool lost silently is published as removed by the resync thread, loads are timed for the
    router, shared-prefix
    aliases let a second tenant read (and not rewrite) the first one's prefix pages only, and
    over a Mooncake pool a batch of pages moves in one call."""
    from sglang_patch.ports import free_port

    prefix = f"test-st-{uuid.uuid4().hex[:8]}"
    # Bound seconds later, in a spawned interpreter: below the ephemeral range, where no
    # outgoing connection (of the tests running beside this one) can take it meanwhile.
    port = free_port()
    try:
        _isolated(_all_checks, prefix, port)
    finally:
        from sglang_patch.pool.shm_pool import destroy_pool

        for suffix in ("lf", "pf", "bad", "ld", "rs", "al"):
            destroy_pool(f"{prefix}-{suffix}")
