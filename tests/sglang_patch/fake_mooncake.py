"""A fake ``MooncakeDistributedStore`` for unit tests of our pool's own logic (the real store:
``test_mooncake_pool.py``): the calls ``MooncakePagePool`` makes, with Mooncake's semantics."""

from __future__ import annotations

import ctypes


class FakeStore:
    """The calls MooncakePagePool makes, with Mooncake's semantics: a put of an existing key
    keeps the old bytes, errors are negative ints, a missing key's get is an error."""

    def __init__(self, objects: dict[str, bytes] | None = None) -> None:
        self.objects: dict[str, bytes] = {} if objects is None else objects
        self.fail_puts = False
        self.closed = 0
        self.regions: dict[int, int] = {}  # registered memory: address -> size
        self.batch_calls = 0
        self.multi_buffer_calls = 0  # the zero-copy ones, counted in batch_calls too
        self.copies: list[tuple[str, list[str]]] = []  # (key, target segments) copied
        self.pending_polls = 1  # query_task answers PENDING this many times per task
        self._tasks: dict[tuple[int, int], int] = {}
        # where each object's replica sits (a transfer endpoint; default: this client's), and
        # the hosts that are gone: a get of an object whose replica is there fails, slowly
        self.where: dict[str, str] = {}
        self.dead_hosts: set[str] = set()
        self.replica_calls = 0
        self.dead_reads = 0

    def setup(self, *args: object) -> int:
        return 0

    def get_hostname(self) -> str:
        return "10.0.0.2:15000"

    def register_buffer(self, ptr: int, size: int) -> int:
        self.regions[ptr] = size
        return 0

    def unregister_buffer(self, ptr: int) -> int:
        return 0 if self.regions.pop(ptr, None) is not None else -1

    def _registered(self, ptr: int, size: int) -> bool:
        return any(a <= ptr and ptr + size <= a + n for a, n in self.regions.items())

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        """Mooncake's: a task id and 0, or an error code for a key that does not exist."""
        if key not in self.objects:
            return (0, 0), -704  # OBJECT_NOT_FOUND
        self.copies.append((key, list(targets)))
        task = (len(self.copies), 0)
        self._tasks[task] = self.pending_polls
        return task, 0

    def query_task(self, task: tuple[int, int]) -> tuple[object, int]:
        left = self._tasks.get(task)
        if left is None:
            return None, -1
        self._tasks[task] = left - 1
        status = "TaskStatus.PENDING" if left > 0 else "TaskStatus.SUCCESS"
        return type("QueryTaskResponse", (), {"status": status})(), 0

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[object]]:
        """Mooncake's descriptors, as far as the pool reads them: memory replicas' endpoints."""
        self.replica_calls += 1

        def desc(endpoint: str) -> object:
            buffer = type("Buffer", (), {"transport_endpoint": endpoint})()
            memory = type("Memory", (), {"buffer_descriptor": buffer})()
            return type("Replica", (), {"is_memory_replica": lambda self: True,
                                        "get_memory_descriptor": lambda self: memory})()

        return {k: [desc(self.where.get(k, "10.0.0.2:16000"))] for k in keys
                if k in self.objects}

    def is_exist(self, key: str) -> int:
        return int(key in self.objects)

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return [self.is_exist(k) for k in keys]

    def batch_put_from(self, keys: list[str], ptrs: list[int], sizes: list[int],
                       config: object) -> list[int]:
        self.batch_calls += 1
        return [self._put(k, [p], [n]) for k, p, n in zip(keys, ptrs, sizes, strict=True)]

    def batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        self.batch_calls += 1
        return [self._get(k, [p], [n]) for k, p, n in zip(keys, ptrs, sizes, strict=True)]

    def batch_put_from_multi_buffers(self, keys: list[str], ptrs: list[list[int]],
                                     sizes: list[list[int]], config: object) -> list[int]:
        self.batch_calls += 1
        self.multi_buffer_calls += 1
        return [self._put(k, p, s) for k, p, s in zip(keys, ptrs, sizes, strict=True)]

    def batch_get_into_multi_buffers(self, keys: list[str], ptrs: list[list[int]],
                                     sizes: list[list[int]], same_node: bool) -> list[int]:
        self.batch_calls += 1
        self.multi_buffer_calls += 1
        return [self._get(k, p, s) for k, p, s in zip(keys, ptrs, sizes, strict=True)]

    def _put(self, key: str, ptrs: list[int], sizes: list[int]) -> int:
        if not all(self._registered(p, n) for p, n in zip(ptrs, sizes, strict=True)):
            return -1  # Mooncake moves registered memory only
        if self.fail_puts:
            return -200  # no space
        self.objects.setdefault(key, b"".join(ctypes.string_at(p, n)
                                              for p, n in zip(ptrs, sizes, strict=True)))
        return 0

    def _get(self, key: str, ptrs: list[int], sizes: list[int]) -> int:
        if not all(self._registered(p, n) for p, n in zip(ptrs, sizes, strict=True)):
            return -1
        data = self.objects.get(key)
        if data is None:
            return -704  # object not found
        if self.where.get(key, "").rsplit(":", 1)[0] in self.dead_hosts:
            self.dead_reads += 1  # the real one stalls seconds on the connect first
            return -800  # TRANSFER_FAIL
        if len(data) != sum(sizes):
            return -600
        at = 0
        for p, n in zip(ptrs, sizes, strict=True):
            ctypes.memmove(p, data[at:at + n], n)
            at += n
        return len(data)

    def remove(self, key: str, force: bool = False) -> int:
        return 0 if self.objects.pop(key, None) is not None else -704

    def remove_all(self, force: bool = False) -> int:
        n = len(self.objects)
        self.objects.clear()
        return n

    def close(self) -> int:
        self.closed += 1
        return 0
