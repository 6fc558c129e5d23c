"""The persistent disk tier (sglang_patch/pool/disk_tier.py, disk_backend.py): bytes, damage,
crashes, capacity, and what is announced after a restart."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import stat
import time

import numpy as np
import pytest
import xxhash

from sglang_patch import launch_server
from sglang_patch.pool.disk_backend import DiskBackend, DiskWrite
from sglang_patch.pool.disk_folder import UnsafeDiskFolder
from sglang_patch.pool.disk_format import SUFFIX, TMP_PREFIX, file_stem, pack_head
from sglang_patch.pool.disk_tier import DiskTier

NS = "tiny@1"


def key(i: int, ns: str = NS, suffix: str = "") -> str:
    return f"{ns}/{i:064x}{suffix}"


def page(seed: int, n: int = 4096) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 255, n, dtype=np.uint8)
    return [data[: n // 2], data[n // 2 :]]  # scattered, like layer_first views


def read(disk: DiskTier, k: str, n: int = 4096) -> np.ndarray | None:
    out = [np.zeros(n // 2, np.uint8), np.zeros(n // 2, np.uint8)]
    return np.concatenate(out) if disk.read_into(k, out) else None


def test_pages_survive_a_reopen_bit_exactly(tmp_path):
    disk = DiskTier(tmp_path, 1 << 20)
    assert disk.write(key(1), page(1), 11, None, 4) == (True, True, [])
    assert disk.write(key(1), page(1), 11, None, 4) == (True, False, [])  # already there
    again = DiskTier(tmp_path, 1 << 20)  # another process, or after a reboot
    assert again.exists(key(1)) and len(again) == 1
    got = read(again, key(1))
    assert got is not None and np.array_equal(got, np.concatenate(page(1)))
    assert read(again, key(2)) is None


def test_a_page_is_synced_then_its_folder_after_the_rename(tmp_path, monkeypatch):
    """Durability order: a new subfolder's entry, the file's bytes, the rename, then the folder
    entry (else a power loss can lose a page that was announced as stored)."""
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("rename"), real_replace(a, b))[1])
    disk = DiskTier(tmp_path, 1 << 20)
    disk.write(key(1), page(1), 11, None, 4)
    (path,) = tmp_path.rglob("*.page")
    new_folder, temp, *rest = calls  # the first page of a subfolder: the root is synced too
    assert new_folder == str(tmp_path) and TMP_PREFIX in temp
    assert rest == ["rename", str(path.parent)]


@pytest.mark.parametrize("damage", ["flip", "truncate", "header", "empty"])
def test_a_damaged_file_is_a_miss_and_is_removed(tmp_path, damage):
    disk = DiskTier(tmp_path, 1 << 20)
    disk.write(key(1), page(1), 11, None, 4)
    (path,) = [p for p in tmp_path.rglob("*.page")]
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-10] ^= 0xFF
    elif damage == "truncate":
        data = data[:-100]
    elif damage == "header":
        data[6] ^= 0x01
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    assert read(disk, key(1)) is None
    assert not path.exists() and not disk.exists(key(1)) and disk.corrupt == 1


def test_a_page_of_another_size_or_key_is_refused(tmp_path):
    disk = DiskTier(tmp_path, 1 << 20)
    disk.write(key(1), page(1), 11, None, 4)
    assert read(disk, key(1), n=2048) is None  # the reader expects another page size


def test_lru_capacity_evicts_the_oldest_and_names_them(tmp_path):
    disk = DiskTier(tmp_path, 3 * 4300)  # room for 3 pages and their headers
    for i in range(3):
        assert disk.write(key(i), page(i), 100 + i, None, 4).evicted == []
        time.sleep(0.01)
    assert read(disk, key(0)) is not None  # touched: now the newest
    _, new, evicted = disk.write(key(3), page(3), 103, None, 4)
    assert new and evicted == [101]
    assert not disk.exists(key(1)) and disk.used_bytes <= disk.capacity_bytes
    assert [p.tag for p in sorted(DiskTier(tmp_path, 1 << 20).pages(), key=lambda p: p.tag)] \
        == [100, 102, 103]


def _write_forever(root: str) -> None:
    disk = DiskTier(root, 1 << 30)
    i = 0
    while True:
        disk.write(key(i), page(i, 1 << 20), i, None, 4)
        i += 1


def test_a_writer_killed_mid_write_leaves_a_readable_consistent_tier(tmp_path):
    proc = mp.get_context("spawn").Process(target=_write_forever, args=(str(tmp_path),))
    proc.start()
    deadline = time.monotonic() + 60
    while len(list(tmp_path.rglob("*.page"))) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    disk = DiskTier(tmp_path, 1 << 30)
    assert not [p for p in tmp_path.rglob(f"{TMP_PREFIX}*")]  # leftovers deleted at open
    assert len(disk) >= 5
    for p in disk.pages():  # every page that is there reads back whole
        got = read(disk, p.key, n=1 << 20)
        assert got is not None and np.array_equal(got, np.concatenate(page(p.tag, 1 << 20)))
    assert disk.corrupt == 0


def test_the_announcement_follows_chains_from_their_roots(tmp_path):
    disk = DiskTier(tmp_path, 1 << 20)
    backend = DiskBackend(disk, 4)
    # chain 1 -> 2 -> 3; 5 whose parent (4) is not on disk; another namespace; another shard
    for i, parent in ((1, None), (2, 1), (3, 2), (5, 4)):
        disk.write(key(i), page(i, 64), i, parent, 4)
    disk.write(key(6, ns="other@1"), page(6, 64), 6, None, 4)
    disk.write(key(7, suffix="/tp1of2"), page(7, 64), 7, None, 4)
    disk.write(key(8), page(8, 64), 8, None, 16)  # another page size
    (batch,) = backend.announcement(NS, "")
    assert [(e["block_hashes"], e["parent_block_hash"], e["medium"]) for e in batch] == [
        ([1], None, "DISK"), ([2], 1, "DISK"), ([3], 2, "DISK")]
    (shard,) = backend.announcement(NS, "/tp1of2")
    assert [e["block_hashes"] for e in shard] == [[7]]


def test_write_through_says_what_is_on_disk_and_what_it_evicted(tmp_path):
    backend = DiskBackend(DiskTier(tmp_path, 2 * 4300), 4)
    present, evicted = backend.write([DiskWrite(key(1), page(1), 1, None), None,
                                      DiskWrite(key(2), page(2), 2, 1)])
    assert present == {0, 2} and evicted == []
    # a third page evicts the first; within one call, a page evicted by a later one is not on disk
    present, evicted = backend.write([DiskWrite(key(3), page(3), 3, 2),
                                      DiskWrite(key(4), page(4), 4, 3)])
    assert evicted == [1, 2] and present == {0, 1}
    present, evicted = backend.write([DiskWrite(key(5), page(5), 5, 4),
                                      DiskWrite(key(6), page(6), 6, 5),
                                      DiskWrite(key(7), page(7), 7, 6)])
    assert present == {1, 2} and 5 in evicted
    ok, damaged = backend.read_into(key(7), [np.zeros(2048, np.uint8), np.zeros(2048, np.uint8)])
    assert ok and damaged == []
    assert [sorted(e["block_hashes"]) for e in backend.clear()] == [[6, 7]]
    assert len(backend.disk) == 0


def test_a_file_another_process_wrote_or_removed_is_seen(tmp_path):
    mine, other = DiskTier(tmp_path, 1 << 20), DiskTier(tmp_path, 1 << 20)
    other.write(key(1), page(1), 1, None, 4)
    assert mine.exists(key(1)) and read(mine, key(1)) is not None
    mine.write(key(2), page(2), 2, None, 4)
    other.exists(key(2))
    other.remove(key(2))  # gone under mine's feet: mine writes it again
    assert mine.write(key(2), page(2), 2, None, 4).new
    assert read(other, key(2)) is not None


def test_a_live_writers_temporary_file_survives_another_open(tmp_path):
    (tmp_path / "ab").mkdir()
    live = tmp_path / "ab" / f"{TMP_PREFIX}{os.getpid()}-0000"
    dead = tmp_path / "ab" / f"{TMP_PREFIX}999999999-0000"
    live.write_bytes(b"x")
    dead.write_bytes(b"x")
    DiskTier(tmp_path, 1 << 20)
    assert live.exists() and not dead.exists()


# --- who may write the folder (issue 35, item 13) ---------------------------------------------


def forge(root, k: str, payload: bytes, tag: int = 11) -> None:
    """What anyone who can write the folder can do: a page with its checksums recomputed."""
    name = file_stem(k)
    (root / name[:2]).mkdir(exist_ok=True)
    head = pack_head(k, len(payload), xxhash.xxh3_64_intdigest(payload), tag, None, 4)
    (root / name[:2] / (name + SUFFIX)).write_bytes(head + payload)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_what_the_tier_creates_is_its_users_alone(tmp_path):
    root = tmp_path / "a" / "pages"
    disk = DiskTier(root, 1 << 20)
    disk.write(key(1), page(1), 11, None, 4)
    (path,) = root.rglob("*.page")
    assert (mode(root), mode(path.parent), mode(path)) == (0o700, 0o700, 0o600)


@pytest.mark.parametrize("bits", [0o777, 0o1777, 0o757, 0o770, 0o730])
def test_a_folder_others_can_write_is_refused_naming_it_its_mode_and_the_fix(tmp_path, bits):
    root = tmp_path / "pages"
    root.mkdir()
    forge(root, key(1), bytes(4096))  # checksums right: only the folder's mode can tell
    root.chmod(bits)
    with pytest.raises(UnsafeDiskFolder) as err:
        DiskTier(root, 1 << 20)
    msg = str(err.value)
    assert str(root) in msg and f"{bits & 0o7777:04o}" in msg and f"chmod go-w {root}" in msg
    assert ("every user" if bits & 0o002 else "its group") in msg


@pytest.mark.parametrize("bits", [0o700, 0o750, 0o755])
def test_a_folder_only_its_user_can_write_is_accepted(tmp_path, bits):
    root = tmp_path / "pages"
    root.mkdir()
    root.chmod(bits)
    DiskTier(root, 1 << 20).write(key(1), page(1), 11, None, 4)
    assert read(DiskTier(root, 1 << 20), key(1)) is not None


def test_a_subfolder_others_can_write_is_refused(tmp_path):
    DiskTier(tmp_path, 1 << 20).write(key(1), page(1), 11, None, 4)
    (sub,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    sub.chmod(0o777)
    with pytest.raises(UnsafeDiskFolder) as err:
        DiskTier(tmp_path, 1 << 20)
    assert f"{sub} is writable by every user" in str(err.value)
    assert f"chmod -R go-w {tmp_path}" in str(err.value)


def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "pages"
    root.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(root, 54321, -1)  # a non-root owner could chmod it and write in it
    else:  # a folder owned by the real uid, seen by an engine running as another
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 54321)
    with pytest.raises(UnsafeDiskFolder, match=r"owned by uid .*fix: chown"):
        DiskTier(root, 1 << 20)


def test_a_world_writable_parent_without_the_sticky_bit_is_refused(tmp_path):
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)  # anyone could rename pages/ away and put theirs there
    with pytest.raises(UnsafeDiskFolder, match=r"parent .*open is writable by every user"):
        DiskTier(tmp_path / "open" / "pages", 1 << 20)
    (tmp_path / "open").chmod(0o1777)  # like /tmp: renaming another's entry is refused
    DiskTier(tmp_path / "open" / "pages", 1 << 20)


def test_a_page_file_others_can_write_is_removed_at_open(tmp_path):
    DiskTier(tmp_path, 1 << 20).write(key(1), page(1), 11, None, 4)
    DiskTier(tmp_path, 1 << 20).write(key(2), page(2), 12, None, 4)
    (path,) = [p for p in tmp_path.rglob("*.page") if p.stem == file_stem(key(1))]
    path.chmod(0o666)  # another user could have rewritten it in place
    disk = DiskTier(tmp_path, 1 << 20)
    assert not path.exists() and len(disk) == 1 and read(disk, key(1)) is None
    assert read(disk, key(2)) is not None


def test_the_launch_wrapper_refuses_such_a_folder_in_one_line_before_starting(
        tmp_path, monkeypatch, capsys):
    root = tmp_path / "pages"
    root.mkdir()
    root.chmod(0o777)
    monkeypatch.setattr(launch_server, "_start", lambda plan: pytest.fail("SGLang started"))
    rc = launch_server.main(["--model-path", str(tmp_path / "model"),
                             "--radix-global-pool-disk", str(root)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"radix-global sglang: error: disk tier folder {root} is writable by "
                          "every user (mode 0777)") and f"chmod go-w {root}" in err
